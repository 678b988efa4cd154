"""The planner's lab: training data, LoRA and Medusa-head training, the Medusa tree's
calibration, plan-quality evaluation, losslessness and benchmarks. What the product needs
at setup (the model build, the tree search, the measurements) is in rufus/qp/."""
