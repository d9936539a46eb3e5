"""CPU offload of sharded state (FSDP2 ``CPUOffloadPolicy``); a modifier of zero2 / zero3.

Method card
- What: sharded parameters, gradients and optimizer state live in host memory; parameters are copied to the device
  for compute, gradients back, and the optimizer steps on the CPU.
- When it should pay: device memory is the limit and the host has memory and PCIe bandwidth to spare; it trades step
  time for device memory. Not run on a GPU yet. On a CPU the "device" already is host memory: no saving.
- Sources: Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021;
  ``torch.distributed.fsdp.CPUOffloadPolicy`` docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-offload (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->
"""

from __future__ import annotations

from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class Offload(Technique):
    name = "offload"
    summary = "CPU offload of sharded params, grads and optimizer state (with zero2 or zero3)"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    claims = (
        Claim("speedup", 0.5, 1.0, "GPU training with state in host memory: slower steps for a larger model",
              "Ren et al., ZeRO-Offload, USENIX ATC 2021"),
    )

    def check(self, ctx: Context) -> str | None:
        if not {"zero2", "zero3"} & set(ctx.technique_names):
            return "offload modifies FSDP sharding: combine it with zero2 or zero3 (e.g. zero3+offload)"
        return None
