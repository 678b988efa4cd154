# Local stand-in for python:3.11-slim-bookworm, for machines that cannot pull public images
# (docker/bases.sh builds it on the debootstrap base). Debian 12's own Python 3.11 with what
# the official image also has: venv, the shared libpython (the Triton Python backend stub
# links it) and the headers (torch.compile's C++ kernels include Python.h).
ARG DEBIAN_IMAGE=rufus-base/debian:12
FROM ${DEBIAN_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3-pip libpython3.11 python3.11-dev ca-certificates \
    && ln -s /usr/bin/python3.11 /usr/local/bin/python3 \
    && ln -s /usr/bin/python3.11 /usr/local/bin/python \
    && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
