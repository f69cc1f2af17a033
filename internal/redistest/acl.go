package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// LimitedUserRules returns the rules, after ACL SETUSER <name>, of a
// least-privilege user for authlimit whose keys all start with prefix+":":
//
//	ACL SETUSER authlimit reset on >PASSWORD ~PREFIX:* resetchannels -@all +ping +select +client|setname +eval +evalsha +script|load +get +mget +set +setrange +del +exists +pexpire +zadd +zcard +zrange +zrank +zrem +zremrangebyrank +zscore +time
//
// What each part is for, as found on Redis 7.0.15:
//   - reset ... resetchannels -@all: start from nothing (reset alone also
//     clears keys, channels and commands, but acl-pubsub-default could
//     grant every channel back); no Pub/Sub at all.
//   - ~PREFIX:*: read and write keys under the prefix only. A command or
//     EVAL naming another key in KEYS fails up front with "NOPERM this user
//     has no permissions to access one of the keys used as arguments"; a
//     script whose redis.call touches another key fails inside the script,
//     and Redis 7.0 reports that as "ERR The user executing the script
//     can't access at least one of the keys mentioned in the command
//     arguments" (not NOPERM). IsNoPerm recognises both.
//   - +ping and the go-redis handshake: HELLO and AUTH need no grant
//     (Redis marks them no-auth); go-redis sends CLIENT SETNAME when
//     ClientName is set (in HELLO and again on its own), and SELECT only
//     for a DB other than 0. Redis 7.0 has no CLIENT SETINFO, so ACL
//     SETUSER rejects +client|setinfo there ("Unknown command"); go-redis
//     ignores the error reply to SETINFO. On Redis 7.2 and later
//     NewACLUser adds +client|setinfo so the library name is recorded.
//   - +eval +evalsha +script|load: go-redis's Script.Run sends EVALSHA and
//     falls back to EVAL; Script.Load sends SCRIPT LOAD. Nothing else of
//     SCRIPT (no FLUSH, KILL or EXISTS).
//   - the commands the scripts call: redis.call is checked against the
//     same user, command by command, so each one must be granted: GET, MGET, SET
//     (with PX), SETRANGE, DEL, EXISTS, PEXPIRE, ZADD, ZCARD, ZRANGE (BYSCORE, REV,
//     LIMIT), ZRANK, ZREM, ZREMRANGEBYRANK, ZSCORE and TIME.
//
// extraCommands, without "+", grant more, for scripts that need them.
func LimitedUserRules(password, prefix string, extraCommands ...string) []string {
	rules := []string{"reset", "on", ">" + password, "~" + prefix + ":*", "resetchannels", "-@all",
		"+ping", "+select", "+client|setname", "+eval", "+evalsha", "+script|load",
		// What the scripts call.
		"+get", "+mget", "+set", "+setrange", "+del", "+exists", "+pexpire",
		"+zadd", "+zcard", "+zrange", "+zrank", "+zrem", "+zremrangebyrank", "+zscore",
		"+time"}
	for _, c := range extraCommands {
		rules = append(rules, "+"+strings.ToLower(c))
	}
	return rules
}

// ACLUser is a least-privilege user on a Redis server; see
// LimitedUserRules.
type ACLUser struct {
	// Name and Password log the user in.
	Name, Password string
	// Prefix is the key prefix the user may touch, without the ":".
	Prefix string
	// URL is redis://<name>:<password>@<addr>.
	URL string
	// Rules are the ACL SETUSER rules applied, password included.
	Rules []string
}

// NewACLUser adds a user with LimitedUserRules (and +client|setinfo on
// Redis 7.2 and later) to srv, a plain-TCP server the test started, under
// a random name and password. srv's default user keeps every right, for
// the test's own setup.
func NewACLUser(t testing.TB, srv *Server, prefix string, extraCommands ...string) *ACLUser {
	t.Helper()
	if !srv.Owned || srv.proc == nil || srv.tlsConfig != nil {
		t.Fatalf("redistest: NewACLUser needs a plain-TCP server the test started (NewLocal)")
	}
	rules := LimitedUserRules("", prefix, extraCommands...)
	info, err := commandString(srv.Addr, "INFO", "server")
	if err != nil {
		t.Fatalf("redistest: NewACLUser: INFO server on %s: %v\n%s", srv.Addr, err, tail(srv.proc.spec.logPath()))
	}
	if versionAtLeast(infoField(info, "redis_version"), 7, 2) {
		rules = append(rules, "+client|setinfo")
	}
	return newACLUser(t, srv, prefix, rules)
}

// newACLUser adds a user with rules to srv; the rule ">" gets a random
// password appended.
func newACLUser(t testing.TB, srv *Server, prefix string, rules []string) *ACLUser {
	t.Helper()
	u := &ACLUser{Name: "authlimit-" + randomHex(4), Password: randomHex(16), Prefix: prefix}
	args := []any{"ACL", "SETUSER", u.Name}
	for _, r := range rules {
		if r == ">" {
			r += u.Password
		}
		u.Rules = append(u.Rules, r)
		args = append(args, r)
	}
	if _, err := command(srv.Addr, args...); err != nil {
		t.Fatalf("redistest: ACL SETUSER %s %s: %v\n%s", u.Name, strings.Join(u.Rules, " "), err, tail(srv.proc.spec.logPath()))
	}
	u.URL = "redis://" + url.UserPassword(u.Name, u.Password).String() + "@" + srv.Addr
	return u
}

// Client returns a client logged in as the user, closed when t ends.
func (u *ACLUser) Client(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(u.URL)
	if err != nil {
		t.Fatalf("redistest: parse the ACL user's URL: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// IsNoPerm reports whether err is Redis refusing a command or a key for
// lack of ACL rights: a NOPERM error, or the error Redis 7.0 raises inside
// a script ("... The user executing the script can't ...").
func IsNoPerm(err error) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	msg := err.Error()
	if errors.As(err, &re) {
		msg = re.Error()
	}
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "The user executing the script can't")
}

// versionAtLeast reports whether version "x.y.z" is at least major.minor.
func versionAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	x, err1 := strconv.Atoi(parts[0])
	y, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return x > major || x == major && y >= minor
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
