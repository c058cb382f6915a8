"""Reward functions the TRL way: several of them, weighted, each called once per batch of completions.

A reward function has TRL's signature (`GRPOTrainer(reward_funcs=...)`):

    def exact(prompts, completions, completion_ids, answer, **kwargs) -> list[float | None]:
        return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]

    prompts         the batch's prompts, as the dataset has them (a string, or a list of messages)
    completions     one per prompt, in the prompt's form: a string for string prompts,
                    [{"role": "assistant", "content": text}] for conversational ones
    completion_ids  the sampled token ids of each completion (the stop token included)
    <column>        every other column of the dataset rows, one list each ("answer" above)
    trainer_state   `RewardState(global_step, max_steps)` (TRL: the Trainer's state)
    log_metric      log_metric(name, value): logged as reward/<function>/<name> (the batch's mean)
    log_extra       log_extra(column, values): one value per completion, kept in info["reward_extra"]

Only the keywords a function names are passed, unless it takes **kwargs (then all of them).
A named parameter that is none of these must be a column of every row: `check_columns`
refuses the data before training otherwise, naming the function, the column and the row.

It returns one reward per completion: a finite number, or None where the function does not
apply to that row (TRL: None is left out of the weighted sum). NaN, Inf, a string, a list of
the wrong length, or no list at all is a `RewardError` naming the function, the row(s) and
the value. `combine` is the weighted sum; a row that every source left None is unscorable
(TRL excludes it from the baseline; the HF commands drop it from the update).

A `RewardFunction` is a grader (`trajtune.sources.graders.Grader`): `Scored` takes it, weighted, with the
other graders (`unique_names`: two functions called `reward` from two files are named by file too).

How the calls run (`RewardFunction.start`, workers.py):
  * the functions of one batch are called at the same time, one call each;
  * a function given as a spec ('file.py:fn', 'module:fn') runs in its own worker process
    (started once, reused, the module imported there): a call that runs past `timeout`
    seconds is stopped by killing the process, which nothing in the function can block
    (a hung C call, a GIL-holding regex); a plain callable runs in a thread of this process,
    where the time limit only stops the waiting (a thread cannot be killed);
  * a batch call that raises or overruns is called again row by row (`LOCATE_WORKERS` at a
    time, each under the time limit) to find the rows: an exception stops the run with a
    `RewardError` that shows the function's own traceback once and names the rows
    ('prompts.jsonl:3'); a row that overruns alone fails (its episode gets no reward: `failed`),
    and more failed rows than `max_fault_share` of the batch stop the run (`graders.check_faults`).
Nothing here imports torch: a worker starts in ~0.1 s plus the reward module's own imports.

    functions.py   loading a spec, one call, the checks of what a function returns; combine
    workers.py     the worker processes the spec'd functions run in (time limits, faults); unique_names
    rubric.py      rubrics as rewards (a judge scores each criterion)
    controls.py    the random-reward control
    answers.py     answer extraction (\\boxed{}, '####', 'The answer is', a letter) and exact-match rewards
    rlvr.py        RLVR knobs as rewards: format, partial credit, length penalties, tests passed
    language.py    the language-consistency reward (the reasoning's share of words in a script)
"""

from .functions import (RESERVED, RewardBatch, RewardError, RewardState, callable_name, check_columns, combine,
                        load_reward_function, reward_verifier, signature_of, source_metrics, user_traceback)
from .workers import LOAD_TIMEOUT_S, LOCATE_WORKERS, RewardFunction, unique_names, wait_all

__all__ = ["RESERVED", "RewardBatch", "RewardError", "RewardState", "callable_name", "check_columns", "combine",
           "load_reward_function", "reward_verifier", "signature_of", "source_metrics", "user_traceback",
           "LOAD_TIMEOUT_S", "LOCATE_WORKERS", "RewardFunction", "unique_names", "wait_all"]
