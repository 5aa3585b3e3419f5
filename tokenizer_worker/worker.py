"""The tokenizer worker process: between the server (text) and the engine (token ids).

From the server: GenerateRequest (chat template, tokenize, check, fan out n choices to the
engine), AbortRequest (forwarded for every unfinished choice), tokenize / detokenize requests.
From the engine: TokenDeltas, turned into TextDeltas by one IncrementalDetokenizer per choice;
a stop string ends its choice here and the engine is told to abort that child at once. Token
deltas for ids it does not know (aborted, finished, late duplicates) are dropped. A request with
structured outputs goes on to the engine only once its grammar compiled here (`grammar_check`).
A traced request ("trace": true) has its first choice traced, here and in the engine (`trace`).
"""
from __future__ import annotations

import logging

import msgspec
import zmq

from common.child_process import IDLE_POLL_MS, ParentWatch, run_child
from common.gc_heap import freeze_startup_heap
from common.errors import InvalidRequest
from common.ipc import Channel, IpcPaths, drain, open_socket
from common.messages import (AbortRequest, DetokenizeRequest, DetokenizeResponse, EngineOutputs, EngineReady,
                             EngineRequest, FromEngine, GenerateRequest, ProcessError, PromptAccepted,
                             RequestRejected, TextDelta, TextOutputs, TokenizeRequest, TokenizeResponse,
                             ToTokenizerWorker)
from common.parallel_sampling import fan_out
from common.validation import resolve_max_tokens
from tokenizer_worker.detokenizer import IncrementalDetokenizer
from tokenizer_worker.grammar_check import DEFAULT_COMPILE_TIMEOUT_S, CompilersBusy, GrammarChecker
from tokenizer_worker.prompts import PromptTokenizer
from tokenizer_worker.request_state import Choice, WorkerRequest
from tokenizer_worker.stream_check import StreamCheck
from tokenizer_worker.token_text import TokenText
from tokenizer_worker.trace import TRACED_CHOICE, RequestTraceBuilder, chat_stops, prompt_stops, timed

logger = logging.getLogger(__name__)

PROCESS_NAME = "tokenizer_worker"
COMPILE_POLL_MS = 5  # how often the loop looks at grammar compiles in flight


def run_tokenizer_worker(model_dir: str, paths: IpcPaths, log_level: str = "info",
                         grammar_compile_timeout: float = DEFAULT_COMPILE_TIMEOUT_S,
                         detokenize_check: bool = True) -> None:
    """Entry function of the tokenizer worker process (multiprocessing spawn target)."""

    def body(ctx: zmq.Context, to_server: Channel) -> None:
        from_server = open_socket(ctx, zmq.PULL, paths.to_worker, bind=False)
        from_engine = open_socket(ctx, zmq.PULL, paths.from_engine, bind=True)
        to_engine = Channel(open_socket(ctx, zmq.PUSH, paths.to_engine, bind=False))
        worker = TokenizerWorker(PromptTokenizer(model_dir), to_server, to_engine, grammar_compile_timeout,
                                 detokenize_check)
        freeze_startup_heap()
        worker.run(from_server, from_engine)

    run_child(PROCESS_NAME, log_level, paths.to_server, body)


class TokenizerWorker:
    def __init__(self, prompts: PromptTokenizer, to_server: Channel, to_engine: Channel,
                 grammar_compile_timeout: float = DEFAULT_COMPILE_TIMEOUT_S, detokenize_check: bool = True):
        self.prompts = prompts
        self.token_text = TokenText(prompts.tokenizer)
        self.to_server = to_server
        self.to_engine = to_engine
        self.engine: EngineReady | None = None  # limits, known once the engine is up
        self.requests: dict[str, WorkerRequest] = {}
        self.children: dict[str, tuple[WorkerRequest, Choice]] = {}  # by engine request id
        self.grammars = GrammarChecker(prompts.tokenizer, grammar_compile_timeout)
        self.detokenize_check = detokenize_check  # compare each finished choice with a full decode

    def run(self, from_server: zmq.Socket, from_engine: zmq.Socket) -> None:
        server_decoder = msgspec.msgpack.Decoder(ToTokenizerWorker)
        engine_decoder = msgspec.msgpack.Decoder(FromEngine)
        poller = zmq.Poller()
        poller.register(from_server, zmq.POLLIN)
        poller.register(from_engine, zmq.POLLIN)
        parent = ParentWatch()
        while True:
            ready = dict(poller.poll(COMPILE_POLL_MS if self.grammars.pending else IDLE_POLL_MS))
            if self.grammars.pending:
                self.on_compiles_done()
            if not ready:
                parent.check()
            # Engine output first: it frees state and carries the tokens clients wait for.
            if from_engine in ready:
                for frame in drain(from_engine):
                    self.on_engine_message(engine_decoder.decode(frame))
            if from_server in ready:
                for frame in drain(from_server):
                    self.on_server_message(server_decoder.decode(frame))

    # ---- from the server ----------------------------------------------------------------

    def on_server_message(self, msg) -> None:
        request_id = getattr(msg, "request_id", "")
        try:
            if isinstance(msg, GenerateRequest):
                self.generate(msg)
            elif isinstance(msg, AbortRequest):
                self.abort(msg.request_ids)
            elif isinstance(msg, TokenizeRequest):
                self.tokenize(msg)
            elif isinstance(msg, DetokenizeRequest):
                self.to_server.send(DetokenizeResponse(msg.request_id, self.prompts.decode(
                    msg.token_ids, self._limits().vocab_size)))
        except InvalidRequest as exc:
            self.to_server.send(RequestRejected(request_id, str(exc), param=exc.param))
        except ValueError as exc:  # bad input that names no field (e.g. from the tokenizer)
            self.to_server.send(RequestRejected(request_id, str(exc)))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stop the others
            logger.exception("request %s failed in the tokenizer worker", request_id)
            self.to_server.send(RequestRejected(request_id, f"internal error: {type(exc).__name__}", status=500))

    def generate(self, msg: GenerateRequest) -> None:
        limits = self._limits()
        params = msg.sampling_params
        if msg.messages is not None:
            text, template_ms = timed(self.prompts.chat_text, msg.messages, msg.add_generation_prompt, msg.tools,
                                      msg.continue_final_message, msg.chat_template_kwargs)
            ids, tokenize_ms = timed(self.prompts.chat_text_ids, text)
            field, prompts = "messages", [ids]
            traced_stops = chat_stops(msg.messages, text, ids, template_ms, tokenize_ms) if params.trace else []
        else:
            timed_prompts = [timed(self.prompts.text_prompt_ids, p) for p in msg.prompts]
            field, prompts = "prompt", [ids for ids, _ in timed_prompts]
            traced_stops = prompt_stops(msg.prompts[0], *timed_prompts[0]) if params.trace and msg.prompts else []
        for ids in prompts:  # the engine's own admission check, so a bad prompt never reaches it
            resolve_max_tokens(ids, limits.vocab_size, params.max_tokens, limits.max_model_len, param=field)
        req = WorkerRequest(msg.request_id, params, [len(ids) for ids in prompts])
        if params.trace:
            req.trace = RequestTraceBuilder(traced_stops)
        # with tools offered, the tool-call tags must reach the parser even when they are special tokens
        skip_special = params.skip_special_tokens and not (msg.tools and self.prompts.tool_tags_are_special)
        engine_requests = []
        for p, ids in enumerate(prompts):
            first_index = p * params.n
            for i, (child_id, child_params) in enumerate(fan_out(msg.request_id, params, first_index)):
                index = first_index + i
                detokenizer = IncrementalDetokenizer(
                    self.prompts.tokenizer, ids, skip_special_tokens=skip_special,
                    stop=params.stop, include_stop_str_in_output=params.include_stop_str_in_output)
                check = StreamCheck(detokenizer) if self.detokenize_check else None
                choice = Choice(index, p, child_id, detokenizer, stream_check=check)
                if params.echo or params.prompt_logprobs is not None:
                    choice.prompt, choice.prompt_ids = (msg.prompts[p] if msg.messages is None else ids), ids
                req.add_choice(choice)
                if child_params.trace and index != TRACED_CHOICE:
                    child_params = msgspec.structs.replace(child_params, trace=False)
                engine_requests.append(EngineRequest(child_id, ids, child_params))

        def dispatch() -> None:
            self.requests[msg.request_id] = req
            for choice in req.choices.values():
                self.children[choice.child_id] = (req, choice)
            self.to_server.send(PromptAccepted(msg.request_id, sum(req.prompt_lens)))
            for er in engine_requests:
                self.to_engine.send(er)

        if params.structured_outputs is None:
            dispatch()
        else:
            self.grammars.submit(msg.request_id, params.structured_outputs, limits.vocab_size,
                                 limits.eos_token_ids, dispatch)

    def on_compiles_done(self) -> None:
        for pending, error in self.grammars.poll():
            if error is None:
                pending.then()
            elif isinstance(error, InvalidRequest):
                self.to_server.send(RequestRejected(pending.request_id, str(error), param=error.param))
            elif isinstance(error, CompilersBusy):
                self.to_server.send(RequestRejected(pending.request_id, str(error), status=503))
            else:
                logger.error("grammar of %s failed: %r", pending.request_id, error)
                self.to_server.send(RequestRejected(pending.request_id, f"internal error: {type(error).__name__}",
                                                    status=500))

    def abort(self, request_ids: list[str]) -> None:
        child_ids = []
        for request_id in request_ids:
            self.grammars.cancel(request_id)  # still compiling: it never reaches the engine
            req = self.requests.pop(request_id, None)
            if req is None:
                continue  # finished already, or never started: nothing to do
            child_ids += req.unfinished_child_ids()
            for child_id in req.choices:
                self.children.pop(child_id, None)
        if child_ids:
            self.to_engine.send(AbortRequest(child_ids))

    def tokenize(self, msg: TokenizeRequest) -> None:
        if msg.messages is not None:
            ids = self.prompts.chat_prompt_ids(msg.messages, msg.add_generation_prompt, msg.tools,
                                               msg.continue_final_message, msg.chat_template_kwargs)
        else:
            ids = self.prompts.text_prompt_ids(msg.prompt or "", msg.add_special_tokens)
        strs = self.prompts.token_strs(ids) if msg.return_token_strs else None
        self.to_server.send(TokenizeResponse(msg.request_id, ids, strs))

    def _limits(self) -> EngineReady:
        if self.engine is None:
            raise RuntimeError("the engine is not ready")  # the server admits nothing before it is
        return self.engine

    # ---- from the engine ----------------------------------------------------------------

    def on_engine_message(self, msg) -> None:
        if isinstance(msg, EngineOutputs):
            self.on_engine_outputs(msg)
        elif isinstance(msg, EngineReady):
            self.engine = msg
            self.to_server.send(msg)
        elif isinstance(msg, ProcessError):
            self.to_server.send(msg)

    def on_engine_outputs(self, msg: EngineOutputs) -> None:
        deltas: list[TextDelta] = []
        stop_hits: list[str] = []
        for d in msg.deltas:
            entry = self.children.get(d.request_id)
            if entry is None:
                continue  # aborted or finished here already; the engine's late output is dropped
            req, choice = entry
            result = req.on_token_delta(choice, d, self.token_text, self.prompts.tokenizer)
            if result.abort_in_engine:
                stop_hits.append(choice.child_id)
            if choice.finished:
                del self.children[choice.child_id]
            if req.num_unfinished == 0:
                self.requests.pop(req.request_id, None)
            if result.delta is not None:
                deltas.append(result.delta)
        if stop_hits:  # first, so the engine frees those sequences before its next step
            self.to_engine.send(AbortRequest(stop_hits))
        if deltas or msg.stats is not None:
            self.to_server.send(TextOutputs(deltas, msg.stats))
