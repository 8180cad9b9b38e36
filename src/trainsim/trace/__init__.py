"""Execution graphs from and to traces: Chakra ET import/export (trace.chakra); Kineto (torch.profiler)
trace reading (trace.kineto)."""
