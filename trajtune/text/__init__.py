"""Where conversations become tokens.

    render.py          the renderer and Transcript: the one place conversations become tokens, owners per token
    chat.py            a Hugging Face tokenizer's own chat template, every token tagged with its owner
    tokenizers.py      character- and word-level tokenizers for the toy gyms
"""
