"""The host's one /metrics (brokerd.host.metrics): workers' expositions merged by
family, each sample labelled with its worker."""

from __future__ import annotations

from brokerd.host.metrics import label_sample, merge_expositions

WORKER = """# HELP rabbitmq_connections Open connections.
# TYPE rabbitmq_connections gauge
rabbitmq_connections {n}
# HELP rabbitmq_queue_messages Ready messages.
# TYPE rabbitmq_queue_messages gauge
rabbitmq_queue_messages{{vhost="/",queue="q{n}"}} {n}
"""


def test_a_label_goes_in_front_of_the_others_or_alone() -> None:
    assert label_sample('m{a="b"} 1', 3) == 'm{worker="3",a="b"} 1'
    assert label_sample("m 1", 3) == 'm{worker="3"} 1'
    assert label_sample("m{} 1", 0) == 'm{worker="0"} 1'
    assert label_sample('m{a="x y"} 2', 1) == 'm{worker="1",a="x y"} 2'


def test_families_stay_together_with_one_help_and_type_each() -> None:
    merged = merge_expositions({0: WORKER.format(n=0), 1: WORKER.format(n=1)})
    lines = merged.splitlines()
    assert lines == [
        "# HELP rabbitmq_connections Open connections.",
        "# TYPE rabbitmq_connections gauge",
        'rabbitmq_connections{worker="0"} 0',
        'rabbitmq_connections{worker="1"} 1',
        "# HELP rabbitmq_queue_messages Ready messages.",
        "# TYPE rabbitmq_queue_messages gauge",
        'rabbitmq_queue_messages{worker="0",vhost="/",queue="q0"} 0',
        'rabbitmq_queue_messages{worker="1",vhost="/",queue="q1"} 1',
    ]


def test_a_worker_that_did_not_answer_is_simply_absent() -> None:
    merged = merge_expositions({1: WORKER.format(n=1)})
    assert 'worker="0"' not in merged and 'rabbitmq_connections{worker="1"} 1' in merged
