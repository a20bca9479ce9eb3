// Package browsertest opens the web console (package console) in headless
// Chromium — Debian's chromium package, the system binary, driven with
// chromedp — against real PostgreSQL, and writes a screenshot of each page
// it checks to artifacts/. It is a module of its own, so that the
// library's module needs no browser driver.
//
// It is a test helper, not an API for users: a tool for users' confidence
// in the console, run by make test.
package browsertest
