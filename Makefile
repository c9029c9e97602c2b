# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all bench check-java kafka-jars jvm-jar clean

check-java:
	@command -v java >/dev/null 2>&1 || [ -n "$$JAVA_HOME" ] || { \
	  echo "lockgate needs Java 17 or 21 for PySpark, and 'java' is not on PATH."; \
	  echo "Install it, e.g.: sudo apt-get install -y openjdk-17-jre-headless   (Debian/Ubuntu)"; \
	  echo "             or:  brew install openjdk@17                          (macOS)"; \
	  exit 1; }

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(VENV)/bin/python pyproject.toml
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: check-java $(STAMP) jvm-jar
	$(PY) -m lockgate.demo

# Apache Kafka's broker and Spark's Kafka connector for tests/kafka, via mvn (skipped
# with a note when mvn is missing; the Kafka tests then skip, or fail under CI=true).
kafka-jars: $(STAMP)
	PYTHON=$(PY) bash tools/fetch_kafka.sh

# lockgate's JVM classes (the exactly-once Kafka sink's transactional writer) into
# build/jvm/lockgate-kafka.jar, against pyspark's jars and the kafka-clients jar that
# kafka-jars fetched (skipped with a note without javac or kafka-clients: the sink then
# writes with librdkafka). Listed after kafka-jars where both are prerequisites.
jvm-jar: $(STAMP)
	PYTHON=$(PY) bash tools/build_jvm.sh

# One pytest process by default: on the 2-core CI machine two xdist workers (two
# SparkSessions, two Kafka brokers) ran the suite slower than one process did (92% of it
# in 90 min against all of it in 72). PYTEST_WORKERS=2 runs two workers, one test module
# per worker at a time, on a machine with cores and memory to spare.
PYTEST_WORKERS ?= 0

# make test leaves out the tests marked slow (kill -9 runs of other engines and state
# kinds, the standalone cluster, the browser, the first-hour walkthrough, and the wider
# differential matrices of tests/conftest.py's EXTENDED); make test-all runs every test.
test: check-java $(STAMP) kafka-jars jvm-jar
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow"

test-all: check-java $(STAMP) kafka-jars jvm-jar
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

bench: check-java $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache spark-warehouse metastore_db derby.log
