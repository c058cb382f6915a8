"""Models behind one contract (the engine forwards them; environments never see them).

    tiny.py            TinyTransformer: a small decoder with a KV cache; its checkpoint format
    hf.py              any local AutoModelForCausalLM behind the same contract (LoRA, value head, precision)
    hf_random.py       tiny random Llama / Qwen2 models with locally trained tokenizers (tests, benchmarks, demos)
    hub.py             what --model names -> a local folder: a folder, a hub id, a .gguf file, a catalog name
    cache.py           the model cache: GGUF files converted into it once, and where each folder came from
    merging.py         model merging: linear interpolation, task arithmetic, slerp (trajtune merge)
    steering.py        persona tools on the residual stream: hooks, persona vectors, steering, activation capping
"""
