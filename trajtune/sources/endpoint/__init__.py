"""The OpenAI-compatible endpoint: agents that are programs, written against the OpenAI client, sample from the run's
policy, and what they sampled becomes their episodes.

    verifiers.py the verifiers library's environments as agents: `verifiers_tasks` (an environment's dataset as
                 tasks), `verifiers_agent` (its rollout against the endpoint, scored by its rubric),
                 `load_verifiers_env` (an installed environment by id)
"""
