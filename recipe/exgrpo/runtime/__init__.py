"""Operations code that keeps a run healthy, apart from the training path: the stage deadlines and their watchdog,
the stacks of every process of a run, shipping a run to a Ray cluster as a job, and the gradient-norm guard of the
optimiser update."""
