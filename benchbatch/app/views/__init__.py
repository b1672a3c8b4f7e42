"""The terminal view of each experiment, one module per experiment package of the same name:
`show(rec)` prints the finished run (tables and the conclusion, on stdout), `document(rec)`
is what --json prints instead, and an optional `before(rec)` prints a header once the run
is open. Views read the run's rows and metadata; they measure nothing."""
