"""lockgate.spark_conf(): the static Spark settings lockgate's batches are cheaper with."""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest

import lockgate
from lockgate.api.session import UNIX_SOCKET_CONF, _hint_missing_conf


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs Unix sockets")
def test_python_workers_talk_over_unix_sockets_in_the_test_session(spark):
    assert lockgate.spark_conf() == {UNIX_SOCKET_CONF: "true"}
    assert spark.sparkContext.getConf().get(UNIX_SOCKET_CONF) == "true"


def _fake_spark(conf: dict[str, str]):
    getconf = SimpleNamespace(get=lambda key, default=None: conf.get(key, default))
    return SimpleNamespace(sparkContext=SimpleNamespace(getConf=lambda: getconf))


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs Unix sockets")
def test_a_session_without_them_gets_a_hint(caplog):
    with caplog.at_level(logging.INFO, logger="lockgate.api.session"):
        _hint_missing_conf(_fake_spark({}))
    assert "lockgate.spark_conf()" in caplog.text and UNIX_SOCKET_CONF in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lockgate.api.session"):
        _hint_missing_conf(_fake_spark({UNIX_SOCKET_CONF: "true"}))
    assert caplog.text == ""
