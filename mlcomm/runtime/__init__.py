"""Running a lowered program: plans, bindings to buffers and transports, the compiled loops,
the progress thread and the watched waits."""
