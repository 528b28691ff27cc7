"""The CPU demo and the test harness around the CPU backend: the tiny offline assets, the demo, its toy tasks'
rewards (partial credit, the calculator task), the learning curves and the process sampling of a run."""
