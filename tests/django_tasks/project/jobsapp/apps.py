from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobsapp"

    def ready(self) -> None:
        from django.tasks.signals import task_enqueued, task_finished, task_started

        from .tasks import log

        def receiver(name: str):  # type: ignore[no-untyped-def]
            def on_signal(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
                log("signal", name, task_result.id, sender.__name__, task_result.status)
                if name == "finished" and "receiver raises" in task_result.args:
                    raise RuntimeError("the receiver failed")

            return on_signal

        for name, signal in (
            ("enqueued", task_enqueued),
            ("started", task_started),
            ("finished", task_finished),
        ):
            signal.connect(receiver(name), weak=False, dispatch_uid=f"jobsapp-{name}")
