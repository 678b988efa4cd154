"""Multi-node membership: which node is which (``topology``) and the leader/follower control
channel that makes a unit all-or-nothing (``control``). vLLM does the model part."""
