# Airflow image for the reconcile sink: Airflow 3.3.2 + the project's requirements + a Java 17
# runtime, so tasks can run spark-submit (pyspark's launcher) as the driver, in client mode,
# against the standalone Spark cluster in docker-compose.yaml.
# Build context: the repository root (see docker-compose.yaml).
FROM apache/airflow:3.3.2-python3.11

USER root
# /usr/share/man/man1 is missing on slim Debian images and openjdk's postinst needs it.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && apt-get autoremove -yqq --purge \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17
ENV JAVA_HOME=/usr/lib/jvm/java-17
# Mount points of the shared warehouse volume and the Delta jars (./.jars, read-only).
RUN mkdir -p /opt/warehouse /opt/jars \
 && chown airflow:0 /opt/warehouse \
 && chmod 2775 /opt/warehouse

USER airflow
COPY requirements.txt /requirements.txt
# Pinning apache-airflow keeps the requirements from up- or downgrading the image's Airflow.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /requirements.txt

# Bake the project in (docker-compose.yaml also bind-mounts these for development).
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins
COPY --chown=airflow:0 include /opt/airflow/include
COPY --chown=airflow:0 jobs /opt/airflow/jobs
ENV PYTHONPATH=/opt/airflow/include
