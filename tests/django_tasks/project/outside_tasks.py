"""A module of tasks outside the installed apps (the worker would not run them)."""

from django.tasks import task


@task
def stray(a: int) -> int:
    return a
