"""The OpenAI-compatible endpoint: agents that are programs, written against the OpenAI client, sample from the run's
policy, and what they sampled (exact token ids, log-probs, the policy version) becomes their episodes.

    openai.py    the OpenAI wire format of requests, pure: JSON bodies checked with the field named (`parse_chat`,
                 `parse_completion` -> `ChatRequest`, `CompletionRequest`), `APIError` and OpenAI's error JSON
    responses.py the OpenAI wire format of responses, pure: `chat_response`, `completion_response`,
                 `models_response`, streaming chunks and server-sent events (`chat_chunks`, `completion_chunks`, `sse`)
    sessions.py  an agent's requests as one episode, the sampled ids kept exactly: what "extends" means, edited
                 histories, turns and versions (`Session`, `Chats`, `Completions`)
    server.py    `Endpoint`: the HTTP server over a sampler, its routes (per-session base URLs), the batcher
    agents.py    `AgentSource`: a user's agent program per episode, run at once, grouped by task, its typed failures;
                 `AgentConfig` (`trajtune grpo --agent FILE.py:FUNCTION`), `load_agent`
    verifiers.py the verifiers library's environments as agents: `verifiers_tasks` (an environment's dataset as
                 tasks), `verifiers_agent` (its rollout against the endpoint, scored by its rubric),
                 `load_verifiers_env` (an installed environment by id)

    endpoint = Endpoint(sampler, tokenizer).start()    # http://127.0.0.1:PORT/s/<session>/v1 per episode
    source = AgentSource(sampler, tokenizer, run)      # run(task, base_url, session) -> reward | None
"""
