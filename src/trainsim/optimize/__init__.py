"""Strategy search, what-if sweeps, the runners that evaluate many jobs and the results store."""
