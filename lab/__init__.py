"""The lab: benchmarks, simulations, load generators, training and evaluation, and the
headline table they feed. It may import anything; the product (rufus/, follower/, proxy/,
model_repository/, deploy/, docker/) never imports it, and the image does not carry it."""
