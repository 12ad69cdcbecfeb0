-- The shared store's role and database (deploy/README.md), PostgreSQL 15 or newer.
-- Run once on the database server as a superuser:
--   sudo -u postgres psql -v ON_ERROR_STOP=1 -f setup.sql
--
-- No schema here: each collector applies the migrations the database lacks when it starts
-- (table telemark_migrations; under an advisory lock, so collectors starting together apply
-- each one once) and makes the daily partitions it needs. The role owns the database, and so
-- (PostgreSQL 15) its public schema: that is all the rights it needs.

CREATE ROLE telemark LOGIN;

-- UTF8 whatever the cluster's default; text sorts in byte order (COLLATE "C" in the
-- collector's schema) whatever the locale.
CREATE DATABASE telemark OWNER telemark ENCODING 'UTF8' TEMPLATE template0;

-- Only the owner (and superusers) may connect.
REVOKE ALL ON DATABASE telemark FROM PUBLIC;

-- The password, for collectors that connect over TCP: set it in psql, which hashes it
-- (SCRAM-SHA-256, the default password_encryption) before it leaves the client, so it is
-- in no server log:
--   sudo -u postgres psql -c '\password telemark'
-- and put the same password in /etc/telemark/db-password on each collector host (root, 0600;
-- the collector unit hands it over with LoadCredential). Collectors on the database host
-- that connect over the Unix socket with peer authentication need none.
--
-- Then allow the collectors in pg_hba.conf (deploy/postgres/pg_hba.conf) and reload:
--   sudo -u postgres psql -c 'SELECT pg_reload_conf()'
--
-- Connections: each collector holds 1 + --query-readers (default: half of --workers, at
-- least 1, so 3 with the defaults); keep max_connections above that times the collectors.
