"""Stage 2, compose: one stack's Dockerfile from the jinja2 layer templates in ``dockerfiles/``.
"""
