-- Baton hub store on PostgreSQL, migration 0002: the SQLite functions the store's SQL uses that
-- PostgreSQL lacks, under SQLite's names, so each statement is written once.
--
-- json_valid(text): whether the text is well-formed JSON (SQLite's JSON1 `json_valid`), as a
-- boolean. `verify` uses it to find stored payloads that are not JSON.
CREATE FUNCTION json_valid(doc TEXT) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM doc::json;
    RETURN true;
EXCEPTION WHEN others THEN
    RETURN false;
END;
$$;
