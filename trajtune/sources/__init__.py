"""Sources: everything that produces the trajectories a loop trains on, behind one small Protocol.

    base.py        the contract: `Source` (take / after_update / pending / restore / close), `Draw`, `Draws`,
                   `Episodes` (the trajectories with their metrics); the only module the algorithms import
    sampler.py     the sampler seam: `Sampler` (settings fixed when made; sample(prompts, stop_ids, seeds)),
                   `WeightSampler` (+ load, logprobs), `SamplerSettings`, `Decoder` (the engine's decoders)
    rollout.py     the episode loop: lockstep model rollouts over environments, scripted rollouts
    episodes.py    `EpisodeSource`: a policy in environments as a source (groups, seeds, shards, the fault limit);
                   `Measured`: an experiment's counts added to a source's metrics
    faults.py      a failing environment fails its episode, not the run: time limits, the run-level fault limit
    process.py     `SamplerProcess`: the episode loop in a process of its own, with its own copy of the weights
    serve.py       that process's own side: its loop, its log records and errors sent to the trainer
    sync.py        weight syncs and THE sync check of every weight-holding sampler (fingerprints, probe log-probs)
    vllm/          vLLM as the sampler: `VLLMSampler`, `WeightSync`, `VLLMRunner` over a colocated engine or
                   `trajtune vllm-serve` servers (clients.py, sampler.py, weights.py, runner.py)
    endpoint/      the OpenAI-compatible endpoint agents sample through (openai.py: the requests, responses.py:
                   the responses, the OpenAI wire format; verifiers.py: the verifiers library's environments as agents)
    vllm_worker.py what vLLM's workers load: the trainer's weights from a file (a worker extension)
    sampling.py    `SamplingConfig`: a run's one sampling section (backend, draw, budget, staleness, vLLM, sync
                   tolerance, timeout) and `check_sampling`, every rule tying them together, once
    build.py       `episode_source`: THE builder of a run's episode source from its sampling section;
                   `make_sampler`: the one place a backend name becomes a sampler
    overlap.py     `Overlapped`: the next K steps drawn while this one trains, exactly K behind; `overlapped`
                   builds where it runs
    partial.py     `PartialSampler`: partial rollouts (sampling.stale partial), continued under the next update
    staleness.py   `staleness_metrics`: how far behind a step's episodes were sampled (histogram, discarded and
                   resumed shares, length bias), from `Trajectory.versions`; the virtual clock and `discard_stale`
    refill.py      `Refilling`: DAPO's dynamic sampling, more draws until the step's groups carry signal
    record.py      `Recording`: the episodes a loop takes, kept on disk; `Replayed`: a recording trained on again
                   without sampling, bit for bit (sampling.record / sampling.replay, `trajtune replay`)
    rewards/       reward functions the TRL way: functions.py (loading, one call, checks), workers.py (processes)
    graders.py     the `Grader` Protocol (reward functions, reward models, ensembles, judges, rubrics), `Weighted`
    scoring.py     `Scored`: an episode's reward, the weighted sum of its graders' scores; `RewardModel`
    ensemble.py    `RewardEnsemble`: several graders as one (mean, min, mean - k std)
    judge.py       LLM-as-a-judge: the book's MT-Bench templates, greedy verdicts, position swap, cache
    difficulty.py  the offline difficulty filter: keep prompts a policy solves 20-80% of the time
    data.py        datasets in TRL's formats: demonstrations, preference pairs, prompt tasks
    reward_data.py reward-model and KTO data: ranked lists, outcome labels, step labels

A loop's source is a composition, written out where it is built (the experiments):

    sampler = Decoder(engine.sample, SamplerSettings(max_new_tokens=16))
    source = EpisodeSource(sampler, make_env, renderer, max_turns=6)             # on-policy, in the trainer
    source = Scored(EpisodeSource(...), engine, weighted(graders))              # + reward functions, models
    source = overlapped(engine, SamplingConfig(max_staleness=1),                 # one step ahead, in a process
                        lambda policy: EpisodeSource(policy, make_env, renderer), sampler)
    source = episode_source(config.sampling, engine, make_env, renderer, "grpo",  # a run's, as its sampling
                            score=lambda episodes: Scored(episodes, engine, ...))  # section says (build.py)
"""
