"""The OpenAI-compatible endpoint: agents that are programs, written against the OpenAI client, sample from the run's
policy, and what they sampled (exact token ids, log-probs, the policy version) becomes their episodes.

    openai.py    the OpenAI wire format of requests, pure: JSON bodies checked with the field named (`parse_chat`,
                 `parse_completion` -> `ChatRequest`, `CompletionRequest`), `APIError` and OpenAI's error JSON
    responses.py the OpenAI wire format of responses, pure: `chat_response`, `completion_response`,
                 `models_response`, streaming chunks and server-sent events (`chat_chunks`, `completion_chunks`, `sse`)
"""
