package admin

import (
	"embed"
	"path"

	"github.com/valyala/fasthttp"
)

// page is the status page: plain HTML, CSS and JavaScript, no build step.
// It holds no data: its script asks the API with the token the user
// enters, kept in the tab's sessionStorage only.
//
//go:embed page/index.html page/status.js page/status.css
var page embed.FS

// pageFiles are the page's paths and files, with their content types.
var pageFiles = map[string]struct{ file, contentType string }{
	"/":           {"page/index.html", "text/html; charset=utf-8"},
	"/status.js":  {"page/status.js", "text/javascript; charset=utf-8"},
	"/status.css": {"page/status.css", "text/css; charset=utf-8"},
}

// pagePolicy keeps the page to its own files and its own API: no inline
// script, nothing from elsewhere, not framed.
const pagePolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// servePage answers a GET or HEAD of the status page's files, which need
// no token, and reports whether it did.
func servePage(ctx *fasthttp.RequestCtx) bool {
	f, ok := pageFiles[path.Clean(string(ctx.Path()))]
	if !ok || !(ctx.IsGet() || ctx.IsHead()) {
		return false
	}
	b, err := page.ReadFile(f.file)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "the status page is missing from the binary")
		return true
	}
	h := &ctx.Response.Header
	h.Set("Content-Security-Policy", pagePolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set(fasthttp.HeaderCacheControl, "no-store")
	ctx.SetContentType(f.contentType)
	ctx.SetBody(b)
	return true
}
