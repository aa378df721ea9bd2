// Package tests holds fence's tests that need heavy clients (the SQL
// drivers): guard against real PostgreSQL and SQLite. It is a module of its
// own so that the library's go.mod does not require them.
package tests
