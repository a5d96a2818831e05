from django.tasks import task


@task
def noop_gw(i: int) -> int:
    return i


@task(backend="db")
def noop_db(i: int) -> int:
    return i
