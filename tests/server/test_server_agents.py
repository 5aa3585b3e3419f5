"""The OpenAI Agents SDK against the real server: an agent with a function tool, run through the
SDK's default model (the Responses API) and through its chat-completions model, streamed and not.
The model is made to call the tool (tool_choice required) and the run stops at the tool's result,
so the answer is the tool's own output whatever the 135M model would say next. Tracing is off:
it would try to upload traces to OpenAI."""
from __future__ import annotations

import asyncio

import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI

pytestmark = pytest.mark.slow  # a real server process (and the model) per session

MODEL = "SmolLM2-135M-Instruct"
calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    calls.append(city)
    return f"sunny in {city}"


def agent(model) -> Agent:
    return Agent(name="weather", instructions="Answer questions about the weather.", model=model,
                 tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                 model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                                max_tokens=80))


@pytest.fixture(scope="module")
def openai_client(default_server):
    set_tracing_disabled(True)
    return lambda: AsyncOpenAI(base_url=f"{default_server.url}/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("model_class", [OpenAIResponsesModel, OpenAIChatCompletionsModel])
@pytest.mark.parametrize("streamed", [False, True])
def test_agent_calls_a_function_tool(openai_client, model_class, streamed):
    async def run() -> str:
        model = model_class(model=MODEL, openai_client=openai_client())
        if streamed:
            result = Runner.run_streamed(agent(model), "What's the weather in Paris?")
            async for _ in result.stream_events():
                pass
            return result.final_output
        return (await Runner.run(agent(model), "What's the weather in Paris?")).final_output

    calls.clear()
    output = asyncio.run(run())
    assert len(calls) == 1 and output == f"sunny in {calls[0]}"
