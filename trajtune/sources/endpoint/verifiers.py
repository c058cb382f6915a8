"""The verifiers library's environments as black-box agents: their tasks, and an agent that plays one task through the
endpoint and returns the environment's reward.

verifiers (PrimeIntellect, `pip install 'verifiers>=0.2,<0.4'`) writes an environment as a dataset of rows
(`prompt` messages, `answer`, `info`), a rollout that talks to an OpenAI-compatible client (one turn, a tool loop,
a game) and a rubric that scores the finished rollout. That is exactly an agent program for the endpoint:

    env = vf.load_environment("my-env")               # or any vf.Environment built in code (load_verifiers_env)
    tasks = verifiers_tasks(env)                      # one `VerifiersTask` per dataset row, named env:example_id
    agent = verifiers_agent(env)                      # async def run(task, base_url, session) -> reward
    source = AgentSource(sampler, tokenizer, agent)   # the run trains on what the endpoint recorded

The agent builds `openai.AsyncOpenAI(base_url=base_url)` for its session, runs `env.rollout` for the task's row with
the served model name ("policy"), scores the state with `env.rubric.score_rollout` and returns the reward: the
trained tokens are the ones the endpoint sampled, never the environment's re-rendered history.

What verifiers reports as the policy's own doing is the episode's: an empty or malformed reply is scored by the
rubric (usually 0), a prompt past the context (the endpoint's token budget) ends the rollout as truncated and is
scored too. Any other error the rollout records (the endpoint refusing a request, a tool's infrastructure failing)
is raised, so `AgentSource` makes the episode an ENV_ERROR (out of the loss and the group baseline). Rubrics that
score a group of rollouts together (group reward functions) are refused when the agent is made: each endpoint
episode is scored alone.

The adapter targets the classic `verifiers.Environment` API (tested with verifiers 0.1.14, 0.2.1 and 0.3.1; 0.4
replaced it with `verifiers.v1`); verifiers is imported when an adapter function is first called, with one line
saying how to install it when it is absent or of another API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

INSTALL = "pip install 'verifiers>=0.2,<0.4'"


class VerifiersError(ValueError):
    """verifiers absent or of another API, an environment that cannot be loaded or adapted (one line)."""


def verifiers_module() -> Any:
    """The `verifiers` package, or VerifiersError saying how to install a version the adapter runs."""
    try:
        import verifiers as vf
    except ImportError:
        raise VerifiersError(f"the verifiers adapter needs the verifiers package: {INSTALL}") from None
    version = getattr(vf, "__version__", "?")
    try:
        vf.Environment, vf.OpenAIChatCompletionsClient, vf.load_environment  # noqa: B018 - the classic API
    except AttributeError:
        raise VerifiersError(f"verifiers {version} is installed; the adapter needs the classic Environment API of "
                             f"verifiers 0.2-0.3 (0.4 moved to verifiers.v1): {INSTALL}") from None
    return vf


@dataclass(frozen=True, eq=False)
class VerifiersTask:
    """One row of a verifiers environment's dataset, as a task of the run: `name` (`env:example_id`, what the run's
    groups and logs show) and the `row` itself (`prompt` messages, `answer`, `info`, `example_id`, ...), handed to
    the environment's rollout unchanged."""

    name: str
    row: Mapping[str, Any] = field(repr=False)

    @property
    def prompt(self) -> Any:
        return self.row.get("prompt")

    @property
    def answer(self) -> str:
        return self.row.get("answer", "")

    @property
    def info(self) -> Any:
        return self.row.get("info", {})


def load_verifiers_env(env_id: str, **env_args: Any) -> Any:
    """`verifiers.load_environment(env_id, **env_args)`: the installed environment package whose module is `env_id`
    (dashes as underscores) and its `load_environment`. VerifiersError naming the environment when it cannot."""
    vf = verifiers_module()
    try:
        return vf.load_environment(env_id, **env_args)
    except Exception as e:  # noqa: BLE001 - verifiers wraps every failure of the environment's own code
        cause = e.__cause__ if isinstance(e, ValueError) and e.__cause__ is not None else e
        raise VerifiersError(f"verifiers environment {env_id!r}: {type(cause).__name__}: {cause} (an environment "
                             f"is a package with a load_environment function: pip install it first)") from None


def verifiers_tasks(env: Any, split: str = "train", n: int = -1) -> list[VerifiersTask]:
    """The environment's dataset (`split` "train") or eval dataset ("eval") as tasks, in its order; `n` > 0: the
    first n rows."""
    vf = verifiers_module()
    _check_env(vf, env)
    if split not in ("train", "eval"):
        raise VerifiersError(f"verifiers_tasks: split {split!r}: expected 'train' or 'eval'")
    try:  # (an environment without an eval dataset gives its train dataset, as verifiers' own evaluation does)
        rows = env.get_dataset(n) if split == "train" else env.get_eval_dataset(n)
    except ValueError as e:
        raise VerifiersError(f"verifiers environment {_env_name(env)!r} has no {split} dataset: {e}") from None
    name = _env_name(env)
    tasks = []
    for i, row in enumerate(rows):
        row = dict(row)
        tasks.append(VerifiersTask(f"{name}:{row.get('example_id', i)}", row))
    if not tasks:
        raise VerifiersError(f"verifiers environment {name!r}: its {split} dataset is empty")
    return tasks


def verifiers_agent(env: Any, *, model: str = "policy", sampling_args: Mapping[str, Any] | None = None,
                    api_key: str = "trajtune") -> Callable[[Any, str, str], Any]:
    """An agent for `AgentSource`: `async def run(task, base_url, session) -> float`, the environment's rollout of
    `task` (a `VerifiersTask`, a dataset row or a prompt row: `task_row`) against `base_url` as `model`, scored by
    its rubric.
    `sampling_args`: what the environment sends with each request (OpenAI's names: max_tokens, temperature...;
    none by default: the run's sampling section decides)."""
    vf = verifiers_module()
    _check_env(vf, env)
    if env.requires_group_rollouts:
        raise VerifiersError(f"verifiers environment {_env_name(env)!r} scores groups of rollouts together (group "
                             "reward functions); the endpoint's episodes are scored one at a time")
    import openai

    sampling = dict(sampling_args or {})
    policy_errors = (vf.errors.InvalidModelResponseError,)  # an empty or malformed reply: the policy's, scored

    async def run(task: Any, base_url: str, session: str) -> float:
        row = task_row(task)
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            state = await env.rollout(dict(row), vf.OpenAIChatCompletionsClient(client), model, dict(sampling))
            try:
                error = state.get("error")
                if error is not None and not isinstance(error, policy_errors):
                    raise RolloutFailed(f"verifiers rollout of {getattr(task, 'name', 'a task')} (session "
                                        f"{session}) failed: {_describe(error)}") from error
                await env.rubric.score_rollout(state)
            finally:
                await env.rubric.cleanup(state)
        finally:
            await client.close()
        return float(state["reward"])

    return run


def task_row(task: Any) -> Mapping[str, Any]:
    """The verifiers dataset row a task carries: a `VerifiersTask`'s row, a row itself, or a prompt task of
    `trajtune grpo --data FILE --agent ...` (`sources.data.PromptTask`: its prompt and its other columns, e.g. the
    rows an environment's `get_dataset().to_json(FILE)` wrote)."""
    if isinstance(task, VerifiersTask):
        return task.row
    if isinstance(task, Mapping):
        return task
    columns = getattr(task, "columns", None)
    if isinstance(columns, Mapping) and hasattr(task, "prompt"):
        return {**columns, "prompt": task.prompt}
    raise VerifiersError(f"verifiers agent: task {task!r} is not a VerifiersTask, a dataset row or a prompt row")


class RolloutFailed(RuntimeError):
    """A verifiers rollout that recorded an error not of the policy's making (the episode is an ENV_ERROR)."""


def _check_env(vf: Any, env: Any) -> None:
    if not isinstance(env, vf.Environment):
        raise VerifiersError(f"expected a verifiers Environment (vf.SingleTurnEnv, vf.ToolEnv, load_verifiers_env"
                             f"(...)), got {type(env).__name__}")


def _describe(error: BaseException) -> str:
    """`Type: message`, and its cause's (verifiers wraps the client's error in an empty ModelError)."""
    text = f"{type(error).__name__}: {error}".rstrip(": ")
    cause = error.__cause__
    return text if cause is None else f"{text} <- {_describe(cause)}"


def _env_name(env: Any) -> str:
    return getattr(env, "env_id", "") or type(env).__name__
