#!/bin/sh
# Runs once, when the Postgres volume is first initialised: a role and a database for the imp sketch catalog next to
# Airflow's. The password comes from IMP_CATALOG_PASSWORD (required by docker-compose.yml; no default).
set -eu
: "${IMP_CATALOG_PASSWORD:?IMP_CATALOG_PASSWORD must be set}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" --set=pw="$IMP_CATALOG_PASSWORD" <<'SQL'
CREATE USER imp WITH PASSWORD :'pw';
CREATE DATABASE imp OWNER imp;
SQL
