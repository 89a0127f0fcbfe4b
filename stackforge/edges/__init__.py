"""The machine's edges, in one place: processes (:mod:`~stackforge.edges.runner`), containers and the
Docker engine (:mod:`~stackforge.edges.docker_engine`), the host's GPUs (:mod:`~stackforge.edges.gpus`),
registries, package indexes (:mod:`~stackforge.edges.index`), pip's configuration and the
registry-free base image. No stage above starts a process or a container itself: each goes through
these, with their timeouts and cleanup.
"""
