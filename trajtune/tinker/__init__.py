"""The Tinker training API served by trajtune: `trajtune tinker-serve`, and the same service in-process.

The `tinker` client's four primitives -- forward_backward, optim_step, sample, save weights for a sampler -- are
what trajtune's `Engine` already does; this package speaks the client's protocol over it, so a Tinker script or a
tinker-cookbook recipe runs against a CPU, a GPU or torchrun's engine with trajtune's checks (docs/tinker.md):

    service.py   TinkerService: every route of the protocol as one function, request -> reply (never raises)
    server.py    TinkerServer: the service over HTTP (`trajtune tinker-serve`)
    local.py     service_client(): the real tinker.ServiceClient backed by a service in this process (no socket)
    wire.py      the protocol's protobuf messages (forward_backward in and out, sample responses), built in code
    requests.py  every JSON request parsed and checked, the field named; what trajtune refuses (REFUSED)
    losses.py    Tinker's losses (sums over tokens) over trajtune's objectives; datums -> Batch; forward_backward
    samplers.py  the sampling routes: sampling sessions (saved weights, a base model, a training state), asample
    sampling.py  a model's sampler weights: snapshots, the sync check at each save, sampling with Tinker's parameters
    models.py    one trained model: base model names, LoRA with Tinker's conventions, its engine, its request order
    registry.py  what survives a restart: sessions, models (spec, steps, last saved state), named sampler weights
    futures.py   replies, refusals (HTTPError), the protocol's futures: ids, results, retrieve_future's long poll
"""
