-- Runs once, when the postgres data volume is first initialised (docker-entrypoint-initdb.d).
-- POSTGRES_DB (airflow) already exists: it holds Airflow's metadata. This adds the sink's own
-- metadata database, owned by the same role; RECONCILE_METADATA_URL in docker-compose.yaml points
-- at it and the sink applies its Alembic migrations itself on first use.
CREATE DATABASE reconcile;
-- The Hive metastore service's database (docker-compose.yaml's hive-metastore initializes it).
CREATE DATABASE metastore;
