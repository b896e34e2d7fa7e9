"""Schemathesis hooks for the createResponse run of
test_responses_agents.py: those of schemathesis_hooks (the served model in
every body, errors naming their cause), and generated bodies kept to what
tito answers, so that most cases reach an answer to check against the
spec's `Response` schema. What is left out is refused by name (a 400
naming the parameter; tests/api_responses.rs checks those): server-side
conversations, background runs, moderation, context management, stored
prompts, `truncation: auto`, and a `previous_response_id` (a random one
names no stored response).

`stream` is left out too: the document gives `ResponseStreamEvent` as the
`text/event-stream` schema, meaning each event's data, which schemathesis
applies to the whole SSE event (`{"event", "data"}` with the data as a
string), so that no stream could pass. test_responses_agents.py validates
each streamed event's data against its own schema instead."""

import schemathesis

import schemathesis_hooks  # noqa: F401  (registers the shared hooks)

LEFT_OUT = ("conversation", "background", "moderation", "context_management", "prompt",
            "previous_response_id", "stream")


@schemathesis.hook
def map_body(ctx, body):
    if not isinstance(body, dict):
        return body
    for key in LEFT_OUT:
        body.pop(key, None)
    if body.get("truncation") == "auto":
        body.pop("truncation")
    if "input" not in body:
        body["input"] = "Hello"
    return body
