-- Runs once, when the Postgres volume is first initialised: a database for the imp sketch catalog next to Airflow's.
-- Development credentials; change them (and AIRFLOW_CONN_IMP_CATALOG / IMP_CATALOG_URL) for anything shared.
CREATE USER imp WITH PASSWORD 'imp';
CREATE DATABASE imp OWNER imp;
