"""The user-facing API, mirroring ``pyspark.sql.streaming``."""
