"""Sources: everything that produces the trajectories a loop trains on, behind one small Protocol.

    base.py        the contract: `Source` (take / after_update / pending / restore / close), `Draw`, `Draws`,
                   `Episodes` (the trajectories with their metrics); the only module the algorithms import
    rollout.py     the episode loop: lockstep model rollouts over environments, scripted rollouts
    episodes.py    `EpisodeSource`: a policy in environments as a source (groups, seeds, shards, the fault limit);
                   `Measured`: an experiment's counts added to a source's metrics
    faults.py      a failing environment fails its episode, not the run: time limits, the run-level fault limit
    process.py     `SamplerProcess`: the episode loop in a process of its own, with its own copy of the weights
    serve.py       that process's own side: its loop, its log records and errors sent to the trainer
    sync.py        weight syncs and their checks (fingerprints, probe log-probs)
    vllm.py        vLLM as the sampler: `VLLMRunner` over a colocated engine or `trajtune vllm-serve` servers,
                   the weights synced and checked after every update (`VLLMConfig`, `vllm_runner`)
    vllm_worker.py what vLLM's workers load: the trainer's weights from a file (a worker extension)
    overlap.py     `Overlapped`: the next step drawn while this one trains; `OverlapConfig`
    refill.py      `Refilling`: DAPO's dynamic sampling, more draws until the step's groups carry signal
    rewards/       reward functions the TRL way: functions.py (loading, one call, checks), workers.py (processes)
    graders.py     the `Grader` Protocol (reward functions, reward models, ensembles, judges, rubrics), `Weighted`
    scoring.py     `Scored`: an episode's reward, the weighted sum of its graders' scores; `RewardModel`
    ensemble.py    `RewardEnsemble`: several graders as one (mean, min, mean - k std)
    judge.py       LLM-as-a-judge: the book's MT-Bench templates, greedy verdicts, position swap, cache
    difficulty.py  the offline difficulty filter: keep prompts a policy solves 20-80% of the time
    data.py        datasets in TRL's formats: demonstrations, preference pairs, prompt tasks
    reward_data.py reward-model and KTO data: ranked lists, outcome labels, step labels

A loop's source is a composition, written out where it is built (the experiments):

    source = EpisodeSource(engine.sample, make_env, renderer, max_turns=6)       # on-policy, in the trainer
    source = Scored(EpisodeSource(...), engine, weighted(graders))              # + reward functions, models
    source = overlapped(engine, OverlapConfig(max_staleness=1),                  # one step ahead, in a process
                        lambda policy: EpisodeSource(policy, make_env, renderer))
"""
