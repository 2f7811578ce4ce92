"""Where the confirmation run's servers go: GPUs with room for them, read from NVML.

SGLang takes ``--mem-fraction-static`` (0.85-0.9) of every GPU it uses at start, so a server
started beside a live one on the same GPUs dies at once with CUDA OOM. The control (and the
reproduction) needs tp x pp (x dp, unless DP attention) GPUs, each with room for what the live
server held per GPU (NVML's per-process figures, remembered while it lived; else the static
fraction of the GPU). GPUs are chosen by UUID in ``CUDA_VISIBLE_DEVICES`` (NVML's order and CUDA's
may differ; a UUID is the same for both), and ``--base-gpu-id`` / ``--gpu-id-step`` are dropped
since the visible set then starts at 0.

The answer is never a guess presented as a fact: without NVML the placement is "unknown" and the
plan asks; with no GPU free it is "no-room": with the original alive the experiment keeps to it
(``--stop-original`` frees its GPUs), with it gone the plan cannot start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from radixtop.probes.gpu import GpuInfo, GpuSample

__all__ = ["Placement", "gpus_needed", "place"]

GiB = 1 << 30
DEFAULT_MEM_FRACTION = 0.88  # SGLang sizes its static pool near this when the flag is absent
HEADROOM = 1.05  # a GPU must have this much more free than the estimate


def _flag(flags: Sequence[str], *names: str) -> str | None:
    from radixtop.incident.confirm.control_server import flag_value

    for name in names:
        value = flag_value(flags, name)
        if value is not None:
            return value
    return None


def _int(text: str | None, default: int = 1) -> int:
    try:
        return max(1, int(text)) if text not in (None, "") else default
    except ValueError:
        return default


def gpus_needed(flags: Sequence[str]) -> int:
    """tp x pp (x dp unless DP attention shares the TP GPUs), from SGLang's flags."""
    tp = _int(_flag(flags, "--tp-size", "--tensor-parallel-size", "--tp"))
    pp = _int(_flag(flags, "--pp-size", "--pipeline-parallel-size", "--pp"))
    dp = _int(_flag(flags, "--dp-size", "--data-parallel-size", "--dp"))
    if _flag(flags, "--enable-dp-attention") is not None:
        dp = 1
    return tp * pp * dp


PlacementStatus = Literal["not-needed", "placed", "given", "no-room", "unknown"]


@dataclass(frozen=True)
class Placement:
    status: PlacementStatus
    need: int = 0
    per_gpu_bytes: int | None = None
    visible: str | None = None  # CUDA_VISIBLE_DEVICES for the servers radixtop starts
    lines: tuple[str, ...] = ()  # for the plan
    room_if_stopped: bool = False  # stopping the original would free enough GPUs
    chosen: tuple[int, ...] = field(default=())  # NVML indexes, for the plan

    @property
    def can_start(self) -> bool:
        return self.status in ("not-needed", "placed", "given", "unknown")

    def apply(self, flags: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str], list[str]]:
        """(flags, env, changes) for a server started on this placement."""
        from radixtop.incident.confirm.control_server import remove_flag

        out, new_env = list(flags), dict(env)
        changes: list[str] = []
        if self.visible is None:
            return out, new_env, changes
        for name in ("--base-gpu-id", "--gpu-id-step"):
            if _flag(out, name) is not None:
                out = remove_flag(out, name)
                changes.append(f"dropped {name} (CUDA_VISIBLE_DEVICES chooses the GPUs)")
        new_env["CUDA_VISIBLE_DEVICES"] = self.visible
        changes.append(f"CUDA_VISIBLE_DEVICES={self.visible}")
        return out, new_env, changes


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def place(
    kind: str,
    flags: Sequence[str],
    sample: GpuSample | None,
    *,
    original_pids: Iterable[int] = (),
    original_use: Mapping[str, int | None] | None = None,
    original_gone: bool = False,
    will_stop: bool = False,
    given: str | None = None,
) -> Placement:
    """Choose GPUs for a server of this kind and flags.

    sample: an NVML read (probes.gpu.GpuSample) or None; original_pids: the live server's process
    tree; original_use: bytes it held per GPU UUID (remembered while it lived); original_gone / will_stop:
    the original's memory counts as free; given: the user's own CUDA_VISIBLE_DEVICES (--gpus).
    """
    if kind not in ("sglang", "vllm"):
        return Placement("not-needed", lines=("GPUs          none needed (the simulator runs on the CPU)",))
    if _flag(flags, "--device") == "cpu":  # SGLang's and vLLM's CPU engines: no GPU to find room on
        return Placement("not-needed", lines=("GPUs          none needed (the server runs on the CPU: --device cpu)",))
    need = gpus_needed(flags)
    if _int(_flag(flags, "--nnodes")) > 1:
        return Placement("no-room", need, lines=(
            f"GPUs          the server spans {_flag(flags, '--nnodes')} nodes: "
            "a control cannot be placed from one node; run radixtop confirm on the head node "
            "with --gpus and --launch-command for a single-node control",
        ))
    if given:
        return Placement(
            "given", need, visible=given,
            lines=(f"GPUs          CUDA_VISIBLE_DEVICES={given} (given with --gpus; not checked for room)",),
        )
    state = getattr(getattr(sample, "status", None), "state", None)
    if sample is None or state not in ("ok", "degraded"):
        why = getattr(getattr(sample, "status", None), "message", "") or "not read"
        return Placement("unknown", need, lines=(
            f"GPUs          placement unknown: NVML {why}; a started server needs {need} GPU(s) and may not fit beside "
            "the live server (pass --gpus UUID,... to choose them, or --stop-original)",))
    gpus = list(getattr(sample, "gpus", ()))
    ours = set(original_pids)
    use = dict(original_use or {})
    # Per-GPU need: what the live server held on its busiest GPU, else its static fraction.
    estimates = [u for u in use.values() if u]
    for gpu in gpus:
        held = [p.used_bytes for p in gpu.processes if p.pid in ours and p.used_bytes]
        if held:
            estimates.append(sum(held))
    fraction = _flag(flags, "--mem-fraction-static")
    try:
        fraction_value = float(fraction) if fraction else DEFAULT_MEM_FRACTION
    except ValueError:
        fraction_value = DEFAULT_MEM_FRACTION
    free_original = original_gone or will_stop

    def room(gpu: GpuInfo, count_original_free: bool) -> tuple[bool, int | None, int | None]:
        total = getattr(gpu, "memory_total", None)
        used = getattr(gpu, "memory_used", None)
        if getattr(gpu, "state", "ok") != "ok" or total is None or used is None:
            return False, None, None
        others = [p for p in gpu.processes if not (count_original_free and p.pid in ours)]
        free = total - used
        if count_original_free:
            free += sum(p.used_bytes or 0 for p in gpu.processes if p.pid in ours)
        estimate = max(estimates) if estimates else int(total * fraction_value)
        return (not others and free >= estimate * HEADROOM), free, estimate

    fits = [g for g in gpus if room(g, free_original)[0]]
    per_gpu = (
        max(estimates)
        if estimates
        else (int(gpus[0].memory_total * fraction_value) if gpus and gpus[0].memory_total else None)
    )
    if len(fits) >= need:
        chosen = fits[:need]
        visible = ",".join(g.uuid or str(g.index) for g in chosen)
        return Placement("placed", need, per_gpu, visible, (
            f"GPUs          {', '.join(f'GPU {g.index}' for g in chosen)} (idle, {_gib(per_gpu)} or more free each; "
            f"a started server needs {need}): CUDA_VISIBLE_DEVICES={visible}",), chosen=tuple(g.index for g in chosen))
    busy = []
    for g in gpus:
        holders = sorted({p.pid for p in g.processes})
        _, free, _ = room(g, free_original)
        owner = (
            "the live server"
            if holders and set(holders) <= ours
            else (f"pid {', '.join(map(str, holders[:3]))}" if holders else "nobody")
        )
        busy.append(f"GPU {g.index}: {_gib(free)} free, held by {owner}")
    room_if_stopped = not free_original and len([g for g in gpus if room(g, True)[0]]) >= need
    offer = ("--stop-original stops the live server first (it frees its GPUs) and runs every step there"
             if room_if_stopped else "free GPUs, or pass --gpus UUID,... to choose them yourself")
    return Placement("no-room", need, per_gpu, None, (
        f"GPUs          no room for a server radixtop starts: it needs {need} GPU(s) with {_gib(per_gpu)} free and "
        "no other "
        f"process; {len(fits)} of {len(gpus)} qualify. {offer}",
        *(f"              {line}" for line in busy[:16]),
    ), room_if_stopped=room_if_stopped)
