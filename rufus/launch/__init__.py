"""What operators and the image run to bring the product up: the one tritonserver launcher,
``make serve``'s stack, the default model build, the local unit rig with its supervisor,
the local fleet and the compose rig seen from outside. Never imported by the stub; never
imports the lab (lab/)."""
