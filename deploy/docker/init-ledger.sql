-- The budget ledger's own database beside Dagster's (EAGLE_FORGE_DATABASE_URL); its tables are created on first use.
CREATE DATABASE eagle_ledger;
