"""bench.kafka_timeline: which input record an output record of each query stands for."""

from bench.kafka_timeline import output_row


def test_a_stateless_record_carries_its_sequence_and_source_time():
    assert output_row(b"K7,41,1000,1234", 1300, "stateless") == (41, 1300, 1234)


def test_a_dedup_record_stands_for_the_first_of_its_pair():
    # the dedup query keys pairs by id = seq div 2 and keeps the earlier record, seq 2 id
    assert output_row(b"20,1234", 1300, "dedup") == (40, 1300, 1234)
