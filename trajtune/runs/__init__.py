"""What a run does around its loops, and what it leaves behind.

    loop.py            the loop template and Run (rows, evaluation, checkpoints, exact resume, hooks)
    hooks.py           Hook: on_start, on_episodes, on_save_point
    recorder.py        EpisodeRecorder: a few episodes per step, token by token (for trajtune view)
    resume.py          Checkpointer: periodic and Ctrl-C / SIGTERM saves, exact resume
    stages.py          the stage runner: Stage, StageContext, run_stages (processes, resume, clocks, results)
    rundir.py          RunDir: the run directory's one owner (naming, config.json, what a run finds there)
    lock.py            one run per directory: the lock, named by who holds it
    report.py          report.md / report.html: markdown tables, claims beside the seed's numbers, over seeds
    plots.py           the reports' PNG figures: labelled axes, legends outside the data, readable as drawn
    metrics_report.py  the report of any run directory from its metrics.jsonl (the HF commands')
    verdicts.py        every comparative verdict with its uncertainty (Estimate, judge, Part, decide)
    view.py            view.html: recorded episodes token by token (trajtune view)
    decoders.py        which tokenizer decodes each stage's episodes, and each token's text
"""
