"""response_format and vLLM's structured_outputs, as the StructuredOutputs the engine enforces.

`{"type": "json_object"}`: any JSON object; `{"type": "json_schema", "json_schema": {"schema"}}`:
that schema (strict or not, properties the schema does not list are not generated: vLLM's
default); `structured_outputs` takes one of json (a schema), regex, choice, grammar (EBNF),
json_object or structural_tag. Both at once are refused; whether the grammar compiles is
checked by the tokenizer worker (a 400 naming the field).
"""
from __future__ import annotations

import json

from common.errors import InvalidRequest
from common.messages import StructuredOutputs
from common.structured_outputs import choice_spec, json_object_spec, json_schema_spec
from server.errors import bad_request, invalid_request
from server.protocol import JsonSchemaResponseFormat, SamplingFields


def requested_grammar(body: SamplingFields) -> StructuredOutputs | None:
    rf, so = body.response_format, body.structured_outputs
    if so is not None and so.json_object is False:
        so = None  # {"json_object": false}: nothing asked
    if rf is not None and rf.type != "text" and so is not None:
        raise bad_request("structured_outputs: cannot be combined with response_format", "structured_outputs")
    try:
        if rf is not None and rf.type == "json_object":
            return json_object_spec("response_format")
        if isinstance(rf, JsonSchemaResponseFormat):
            schema = rf.json_schema.schema_
            return json_schema_spec({} if schema is None else schema, "response_format.json_schema.schema")
        if so is None:
            return None
        if so.json_ is not None:
            schema = so.json_
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as exc:
                    raise InvalidRequest("structured_outputs.json", f"not valid JSON: {exc}") from None
            return json_schema_spec(schema, "structured_outputs.json")
        if so.regex is not None:
            return StructuredOutputs("regex", so.regex, "structured_outputs.regex")
        if so.choice is not None:
            return choice_spec(so.choice, "structured_outputs.choice")
        if so.grammar is not None:
            return StructuredOutputs("grammar", so.grammar, "structured_outputs.grammar")
        if so.structural_tag is not None:
            return StructuredOutputs("structural_tag", so.structural_tag, "structured_outputs.structural_tag")
        return json_object_spec("structured_outputs.json_object")
    except InvalidRequest as exc:
        raise invalid_request(exc) from None
