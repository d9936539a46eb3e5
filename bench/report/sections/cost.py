"""Cost: per million samples, to the target and of the quality run, and what a speedup saves per 1,000 training
hours, at a price per machine-hour (only where one is known)."""

from __future__ import annotations

from bench.analyze import cost
from bench.analyze.analysis import Analysis
from bench.report.cells import known, saving_cell
from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 90


def build(ctx: Context) -> Section | None:
    return cost_section(ctx)


def _prices(analysis: Analysis, price: cost.Price | None) -> dict[str, cost.Price]:
    """The price per machine-hour of each machine: the one given to the report, else its first sweep's."""
    out: dict[str, cost.Price] = {}
    for source in analysis.sweep.sources:
        found = price or cost.from_settings(source.settings)
        if found is not None:
            out.setdefault(source.machine, found)
    return out


def _machines_used(analysis: Analysis, machine: str, world_size: int | None) -> int:
    """Machines a trial occupied: a multi-process trial of a multi-node sweep ran on ``nnodes`` of them."""
    if (world_size or 1) <= 1:
        return 1
    nnodes = [int((s.settings or {}).get("nnodes") or 1) for s in analysis.sweep.sources if s.machine == machine]
    return max(nnodes or [1])


def cost_section(ctx: Context) -> Section | None:
    """Cost per million samples, to the target and of the quality run, and what the speedup saves per 1,000
    training hours (its interval mapped endpoint by endpoint); only where a price is known."""
    analysis = ctx.analysis
    prices = _prices(analysis, ctx.price)
    if not prices:
        return None
    rows = []
    ref_machines = {(c.machine, c.workload): _machines_used(analysis, c.machine, c.world_size)
                    for c in analysis.configs.itertuples() if c.is_reference}
    for c in analysis.configs.itertuples():
        pr = prices.get(c.machine)
        if pr is None:
            continue
        p, machines = pr.per_hour, _machines_used(analysis, c.machine, c.world_size)
        per_million = cost.per_million_samples(p, c.sps_median, machines) if known(c.sps_median) and c.sps_median \
            else None
        target = "-"
        if c.target is not None and c.n_ttt and known(c.ttt_one_off_median):
            reached = cost.to_target(p, c.ttt_one_off_median, machines)
            target = "miss" if reached is None else cost.money(reached)
        run = cost.run_cost(p, c.train_time_s, machines) if known(c.train_time_s) else None
        rows.append([Cell(ctx.where(c.workload, c.machine)), Cell(c.technique),
                     Cell(str(machines)), Cell(cost.money(per_million)), Cell(target), Cell(cost.money(run)),
                     saving_cell(c, p, machines / ref_machines.get((c.machine, c.workload), 1))])
    bases = list(dict.fromkeys(f"{f'price ({ctx.names[m]})' if ctx.names[m] else 'price'}: {pr.basis}"
                               for m, pr in prices.items()))
    lines = bases + [
        "The price is per machine-hour (the whole instance, all its devices, whatever the trial used of it); a "
        "multi-process trial of a multi-node sweep counts its nodes as machines. Per million samples = price x "
        "machines / (median samples/s x 3600) x 1e6. To target = price x machines x the median time to target "
        "with the one-off cost (first-step excess and probes) / 3600; a median that misses has no cost ('miss'). "
        "Quality run = price x machines x its median training clock (evaluation excluded) / 3600. Cost to target "
        "and of the quality run are each set's own medians, not paired comparisons: whether a set reaches the "
        "target sooner is the paired time-to-target ratio and its verdict in the workload table. Saved per "
        "1,000 training hours = 1000 x price x (1 - machine ratio / speedup), negative when the set costs more; "
        "the speedup's 95% interval maps to the saving's endpoint by endpoint, and a speedup that is not "
        "significant saves nothing: it says so. The price prices this sweep's measured throughput: it is what "
        "these sets would cost on an instance of that price as fast as the machine that ran them, not a "
        "measurement of that instance."]
    table = Table(["workload", "set", "machines", "cost per million samples", "cost to target", "cost of quality run",
                   f"saved per 1,000 h vs {analysis.baseline} [95% CI]"], rows, wrap=(6,))
    return Section("Cost", "cost", "Cost", [*(Paragraph(line, quiet=True) for line in lines), table])
