"""What-if questions about a measured trace (orchestration layer: may use hardware and cost models).

`gpu`: re-time a trace's kernels for another GPU preset, per op class, from trainsim's compute model.
"""

from .gpu import AchievableRates, achievable_rates, gpu_from_trace_name, time_ratios

__all__ = ["AchievableRates", "achievable_rates", "gpu_from_trace_name", "time_ratios"]
