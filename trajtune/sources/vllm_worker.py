"""What trajtune adds to a vLLM worker (`worker_extension_cls`): load the trainer's weights from a file.

vLLM imports this module in its worker processes (the colocated engine's, `trajtune vllm-serve`'s), so it
imports nothing of trajtune's beyond the fingerprint function and nothing of vLLM's at all. The trainer calls
its method by name: `LLM.collective_rpc("trajtune_load_weights", args=(path,))` colocated, or
`POST /collective_rpc {"method": "trajtune_load_weights", "args": [path]}` on a server started in vLLM's dev
mode (`trajtune vllm-serve` does). The path is a safetensors file the trainer wrote (`trajtune.sources.vllm`):
one disk on one machine, a shared file system across machines.
"""

from __future__ import annotations


class TrajtuneWorker:
    """Mixed into vLLM's worker class: `self.model_runner` is the worker's."""

    def trajtune_load_weights(self, path: str) -> dict[str, list[int]]:
        """Load every tensor of the safetensors file `path` (checkpoint names and layout: the Hugging Face
        model's state dict) into the running model in place, through vLLM's own reload (it re-runs the
        repacking a CPU or quantized layer does after loading) -> the fingerprint of every tensor it loaded
        (`trajtune.sources.sync.weight_fingerprints`' three sums per tensor, as lists), for the trainer to
        compare with its own."""
        from safetensors.torch import load_file

        from .sync import tensor_fingerprints

        tensors = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        return {name: list(sums) for name, sums in tensor_fingerprints(tensors).items()}
