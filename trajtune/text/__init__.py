"""Where conversations become tokens.

    render.py          the renderer and Transcript: the one place conversations become tokens, owners per token
    chat.py            a Hugging Face tokenizer's own chat template, every token tagged with its owner
    tool_calls.py      tool calls as text: the one call parser (json / python), OpenAI tools in a model's template
    tokenizers.py      character- and word-level tokenizers for the toy gyms
"""
