"""The scenarios of the shared-budget benchmark (issue 7); see README.md.

Each scenario is a function (bench) -> (rows, raw): rows for the final table
(bench_table.row(): one figure per share mode and the budget column's
target), raw a JSON-able dict of what was measured. Every share mode runs
against its own fresh nginx and zone, one after the other, in the same
namespace. SCENARIOS maps their names to them; they live in scenario_*.py
(shared code in scenario_common.py) and scale.py.
"""

from scale import scale
from scenario_accuracy import accuracy
from scenario_adversarial import bigmtu, joinleave, short, slowreader, spread24
from scenario_convergence import convergence
from scenario_keepalive import keepalive
from scenario_manyclients import manyclients


SCENARIOS = {
    "convergence": convergence,
    "keepalive": keepalive,
    "accuracy": accuracy,
    "short": short,
    "manyclients": manyclients,
    "slowreader": slowreader,
    "spread24": spread24,
    "joinleave": joinleave,
    "bigmtu": bigmtu,
    "scale": scale,
}
