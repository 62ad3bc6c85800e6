"""The servers the tests and the benchmarks start, outside the installed package and independent
of tests/: a long-lived Airflow (``airflow_stack``) and the object-store emulators
(``emulator_server``, what they share; ``s3_server``: versitygw; ``azurite_server``: Azurite),
and a Hive metastore service (``metastore_server``)."""
