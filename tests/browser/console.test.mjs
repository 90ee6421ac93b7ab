// The web console in a real browser: Debian's Chromium driven by playwright-core.
// Run by crates/fenced/tests/it/console.rs against a real `fenced server`, which sets
// FENCED_URL; screenshots go to SCREENSHOT_DIR.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const URL = process.env.FENCED_URL;
const SHOTS = process.env.SCREENSHOT_DIR || "screenshots";
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
assert.ok(URL, "FENCED_URL must point at a running fenced server");
mkdirSync(SHOTS, { recursive: true });

let browser;
const errors = [];

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run", "--disable-quic"],
  });
});

after(async () => { await browser?.close(); });

/** A fresh page that records console errors and uncaught exceptions. */
async function open(path, viewport = { width: 1366, height: 900 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.on("console", (m) => { if (m.type() === "error") errors.push(`${path}: ${m.text()}`); });
  page.on("pageerror", (e) => errors.push(`${path}: ${e.message}`));
  await page.goto(URL + path);
  return page;
}

// Clicks Run and waits for that run's answer. The page runs once by itself on load, and
// that run's verdict would satisfy a wait for "#verdict.bad" before this one lands (its
// answer then moves the cursor to the end, away from anything the test scrolled to).
async function runAndWait(page) {
  await page.locator("#run").click(); // waits for the load-time run: the button is disabled meanwhile
  await page.waitForFunction(() => !document.getElementById("run").disabled);
}

async function counter(page, panel, name) {
  return Number(await page.locator(`#counters-${panel} [data-counter=${name}] .v`).textContent());
}

test("the tour opens on the first visit and tells the zombie write", async () => {
  const page = await open("/");
  await page.locator("#tour").waitFor({ state: "visible" });
  assert.match(await page.locator("#tour-title").textContent(), /zombie write/);
  await page.locator("#tour-text").filter({ hasText: "accepted it" }).waitFor({ timeout: 20000 });
  await page.locator("#tour-next").click();
  await page.locator("#tour-title").filter({ hasText: "Fencing on" }).waitFor();
  await page.locator("#tour-skip").click();
  assert.equal(await page.locator("#tour").isVisible(), false);
  await page.context().close();
});

test("default: a zombie write counted and drawn; scrub to it", async () => {
  const page = await open("/?notour");
  await page.selectOption("#scenario", "default");
  await runAndWait(page);
  await page.locator("#verdict.bad").waitFor();
  assert.ok((await counter(page, 0, "zombie_writes")) > 0, "zombie writes counted");
  assert.ok((await counter(page, 0, "lost_updates")) > 0, "lost updates counted");
  // Jump to the violation: the scrubber moves there and the zombie arrow is drawn.
  await page.locator("#jump-violation").click();
  const t = Number(await page.locator("#scrub").inputValue());
  const zombie = page.locator(".arrow.zombie").first();
  await zombie.waitFor();
  assert.ok(Math.abs(Number(await zombie.getAttribute("data-t")) - t) <= 40, "the cursor sits at the zombie write");
  // Hovering the arrow tells its event.
  await zombie.hover({ force: true });
  assert.match(await page.locator("#tip").textContent(), /ZOMBIE WRITE accepted/);
  // The counters follow the cursor: at the start of the run nothing has happened.
  await page.locator("#scrub").fill("0");
  assert.equal(await counter(page, 0, "zombie_writes"), 0);
  await page.locator("#jump-violation").click();
  await page.screenshot({ path: `${SHOTS}/lab.png`, fullPage: true });
  await page.context().close();
});

test("fencing on: zero zombie writes and a rejected write drawn", async () => {
  const page = await open("/?notour");
  await page.selectOption("#scenario", "default");
  await page.selectOption("#fencing", "on");
  await runAndWait(page);
  await page.locator("#verdict.good").waitFor();
  assert.equal(await counter(page, 0, "zombie_writes"), 0);
  assert.equal(await counter(page, 0, "lost_updates"), 0);
  assert.ok((await counter(page, 0, "stale_writes_rejected")) > 0);
  await page.locator("#jump-rejected").click();
  await page.locator(".arrow.write.rejected").first().waitFor();
  await page.context().close();
});

test("compare runs the same seed with fencing off and on side by side", async () => {
  const page = await open("/?notour");
  await page.locator("#compare").check();
  await runAndWait(page);
  await page.locator("article.panel[data-fencing=on]").waitFor();
  assert.equal(await page.locator("article.panel").count(), 2);
  assert.ok((await counter(page, 0, "zombie_writes")) > 0);
  assert.equal(await counter(page, 1, "zombie_writes"), 0);
  await page.locator("#jump-violation").click();
  await page.screenshot({ path: `${SHOTS}/lab-compare.png`, fullPage: true });
  await page.context().close();
});

test("the sweep draws its chart", async () => {
  const page = await open("/?notour");
  await page.fill("#sweep-to", "3");
  await page.fill("#sweep-leases", "1,4");
  await page.fill("#sweep-duration", "30");
  await page.locator("#sweep-run").click();
  await page.locator("#sweep-chart svg").waitFor();
  assert.equal(await page.locator("#sweep-table tr.on").count(), 2);
  // Another knob: the lock-delay, its rows in milliseconds, fencing rows zero.
  await page.selectOption("#sweep-over", "lock-delay");
  await page.fill("#sweep-leases", "0,2000");
  await page.locator("#sweep-run").click();
  await page.locator("#sweep-table th").filter({ hasText: "lock-delay" }).waitFor();
  const rows = await page.locator("#sweep-table tr.on td:nth-child(3)").allTextContents();
  assert.deepEqual(await page.locator("#sweep-table tr td:first-child").allTextContents(), ["0 ms", "0 ms", "2000 ms", "2000 ms"]);
  assert.equal(rows.length, 2);
  assert.ok(await page.locator("#sweep-chart svg").filter({ hasText: "lock-delay" }).count() > 0);
  await page.context().close();
});

test("a server error is shown as a clear message", async () => {
  const page = await open("/?notour");
  await page.fill("#clients", "500");
  await runAndWait(page);
  await page.locator("#banner").waitFor({ state: "visible" });
  assert.match(await page.locator("#banner").textContent(), /clients: the console runs 1 to 32 clients/);
  // The refused request is the one console error this test causes on purpose.
  const i = errors.findIndex((e) => e.includes("status of 400"));
  assert.ok(i >= 0, "the browser saw the 400");
  errors.splice(i, 1);
  await page.context().close();
});

test("a narrow screen keeps the laboratory usable", async () => {
  const page = await open("/?notour", { width: 390, height: 844 });
  await runAndWait(page);
  await page.locator("#verdict.bad").waitFor();
  const box = await page.locator("#run").boundingBox();
  assert.ok(box && box.x + box.width <= 390, "the Run button is on screen");
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page does not scroll sideways (${overflow}px)`);
  await page.screenshot({ path: `${SHOTS}/lab-narrow.png`, fullPage: true });
  await page.context().close();
});

// What `fenced sim --seed 1 --json` printed for every scenario (set by console.rs).
const CLI = JSON.parse(process.env.CLI_SUMMARIES || "{}");

test("every scenario opens with its claim and ends with the CLI's numbers", async () => {
  const names = Object.keys(CLI);
  assert.ok(names.length >= 12, `the harness passed the CLI's summaries (${names.length})`);
  const page = await open("/?notour");
  const options = await page.locator("#scenario option").evaluateAll((os) => os.map((o) => o.value));
  assert.deepEqual([...options].sort(), [...names].sort(), "the page lists every scenario the CLI runs");
  for (const name of names) {
    const s = CLI[name];
    await page.selectOption("#scenario", name);
    const claim = await page.locator("#claim").textContent();
    assert.ok(claim.split(/[.:!?]\s/).length >= 2 && claim.length > 80, `${name}: two sentences of claim: ${claim}`);
    await runAndWait(page);
    const v = page.locator(`#claim-verdict[data-scenario="${name}"]`);
    await v.waitFor();
    const text = await v.textContent();
    const expect = [`seed 1,`, `${s.zombie_writes} zombie writes`, `${s.lost_updates} lost updates`];
    if (s.fencing) expect.push(`${s.stale_writes_rejected} stale writes refused`);
    if ("delayed_messages" in s) expect.push(`${s.delayed_messages} messages held`);
    if ("duplicates_absorbed" in s) expect.push(`${s.duplicates_absorbed} duplicate writes absorbed`);
    if ("writes_per_s" in s) expect.push(`${s.writes_per_s} writes/s`);
    if ("early_expiries" in s) expect.push(`${s.clock_steps} steps, ${s.early_expiries} leases ended early`);
    if ("service_crashes" in s) expect.push(`${s.service_crashes} service crashes, ${s.token_regressions} token regressions`);
    if ("duplicate_tokens" in s && "failovers" in s) expect.push(`${s.failovers} failovers, ${s.duplicate_tokens} tokens granted twice`);
    for (const e of expect) assert.ok(text.includes(e), `${name}: the verdict says "${e}": ${text}`);
    assert.ok(text.endsWith(s.safe ? "Safe." : "Unsafe."), `${name}: ${text}`);
  }
  await page.context().close();
});

test("split-brain with a majority: the verdict says no token granted twice", async () => {
  const page = await open("/?notour");
  await page.selectOption("#scenario", "split-brain");
  assert.ok(await page.locator("#replication").isVisible(), "the replication choice shows for split-brain");
  await page.selectOption("#replication", "majority");
  await page.selectOption("#fencing", "on");
  await runAndWait(page);
  const v = page.locator('#claim-verdict[data-scenario="split-brain"]');
  await v.waitFor();
  assert.match(await v.textContent(), /majority: \d+ failovers, 0 tokens granted twice.*Safe\.$/);
  // Primary-backup, fencing still on: lost updates without any zombie write, and the
  // page shows the first, under a token two clients held.
  await page.selectOption("#replication", "primary-backup");
  await runAndWait(page);
  await page.locator('#claim-verdict[data-scenario="split-brain"]').filter({ hasText: "primary-backup" }).waitFor();
  assert.match(await page.locator("#verdict").textContent(), /lost updates without a zombie write.*a token c\d+ held too/);
  await page.selectOption("#zoom", "1500");
  await page.locator("#jump-lost").click();
  await page.locator(".lease.twin").first().waitFor();
  await page.screenshot({ path: `${SHOTS}/lab-split-brain.png`, fullPage: true });
  await page.selectOption("#scenario", "default");
  assert.equal(await page.locator("#replication").isVisible(), false);
  await page.context().close();
});

test("grant labels give way at 4 clients in the compare view, and a lane can be focused", async () => {
  const page = await open("/?notour");
  await page.locator("#compare").check();
  await page.selectOption("#zoom", "20000");
  await runAndWait(page);
  await page.locator("article.panel[data-fencing=on] .arrow.grant").first().waitFor();
  const overlaps = await page.evaluate(() => {
    let n = 0, labels = 0, folded = 0;
    for (const svg of document.querySelectorAll(".seq-svg")) {
      const boxes = [...svg.querySelectorAll(".arrow.grant .arrow-label")].map((t) => t.getBoundingClientRect());
      labels += boxes.length;
      folded += svg.querySelectorAll(".arrow-label.folded").length;
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i], b = boxes[j];
        if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) n += 1;
      }
    }
    return { n, labels, folded };
  });
  assert.ok(overlaps.labels > 0, "grant labels are drawn");
  assert.ok(overlaps.folded > 0, "at this scale some labels fold");
  assert.equal(overlaps.n, 0, "no two grant labels overlap");
  const title = await page.locator(".arrow-label.folded").first().getAttribute("data-folded");
  assert.match(title, /^#\d+( #\d+)+$/, "a folded label lists the grants it stands for");
  // Focus c1: what the other clients do is dimmed, c1's own arrows are not.
  await page.locator('article.panel[data-fencing=off] .lane-label[data-lane="c1"]').click();
  await page.locator(".lane-label.focused").first().waitFor();
  const dims = await page.evaluate(() => ({
    dimmed: document.querySelectorAll(".seq-svg .dim").length,
    undimmed: [...document.querySelectorAll(".seq-svg .arrow")].filter((g) => !g.classList.contains("dim")).length,
  }));
  assert.ok(dims.dimmed > 0 && dims.undimmed > 0, JSON.stringify(dims));
  await page.locator('article.panel[data-fencing=off] .lane-label[data-lane="c1"]').click();
  assert.equal(await page.locator(".seq-svg .dim").count(), 0, "a second click shows every lane again");
  await page.context().close();
});

test("the guided tour walks the whole argument, then the follow-up questions", async () => {
  const page = await open("/?notour");
  await page.locator("#tour-open").click();
  const titles = [];
  for (;;) {
    await page.waitForFunction(() => document.getElementById("tour-text").textContent !== "…");
    titles.push(await page.locator("#tour-title").textContent());
    const text = await page.locator("#tour-text").textContent();
    assert.ok(!/undefined|NaN/.test(text), `${titles.at(-1)}: ${text}`);
    if ((await page.locator("#tour-next").textContent()) === "Done") break;
    await page.locator("#tour-next").click();
  }
  const order = ["zombie write", "Fencing on", "longer lease", "Renewal", "Network delay", "Idempotency", "Clocks",
    "split brain", "senior answer", "distributed lock", "holder pauses", "longer lease help", "lock at all", "Your turn"];
  let at = 0;
  for (const t of titles) if (at < order.length && t.includes(order[at])) at += 1;
  assert.equal(at, order.length, `the tour's steps in the seeds' order: ${titles.join(" | ")}`);
  await page.locator("#tour-next").click();
  assert.equal(await page.locator("#tour").isVisible(), false);
  await page.context().close();
});

test("the live page lists store keys that existed before it opened", async () => {
  const setup = await browser.newContext();
  // The store takes only tokens the service issued: a real grant's.
  const grant = await setup.request.post(`${URL}/v1/locks/before-page/acquire`, { data: { ttl_ms: 30000 } });
  assert.equal(grant.status(), 200);
  const { token, lease_id } = await grant.json();
  const put = await setup.request.put(`${URL}/v1/store/before-page`, { headers: { "Fencing-Token": String(token) }, data: "x" });
  assert.equal(put.status(), 200);
  assert.equal((await setup.request.post(`${URL}/v1/locks/before-page/release`, { data: { lease_id } })).status(), 200);
  await setup.close();
  const page = await open("/live");
  await page.locator('tr[data-key="before-page"]').filter({ hasText: `#${token}` }).waitFor();
  await page.context().close();
});

test("the live page opens with the recent events, an operator's revoke among them", async () => {
  const setup = await browser.newContext();
  // Before the page opens: a grant, and an operator taking the lock from its holder.
  const grant = await setup.request.post(`${URL}/v1/locks/recent%2Fjob/acquire`, { data: { ttl_ms: 30000, holder: "before-the-page" } });
  assert.equal(grant.status(), 200);
  const { token } = await grant.json();
  const revoked = await setup.request.post(`${URL}/v1/locks/recent%2Fjob/revoke`, { data: { token } });
  assert.equal(revoked.status(), 200);
  await setup.close();
  const page = await open("/live");
  // Shown at once from the server's recent events, not from anything after the opening.
  await page.locator("#feed li.granted").filter({ hasText: `granted recent/job with token #${token} to before-the-page` }).waitFor();
  await page.locator("#feed li.released").filter({ hasText: `released recent/job #${token} (forced)` }).waitFor();
  await page.context().close();
});

test("the live page shows a lock acquired through the API, and store writes", async () => {
  const page = await open("/live");
  await page.locator("#status.good").waitFor();
  const api = page.context().request;
  // An old holder, released; then a new one that holds the lock.
  const first = await api.post(`${URL}/v1/locks/demo%2Forders/acquire`, { data: { ttl_ms: 30000 } });
  assert.equal(first.status(), 200);
  const old = await first.json();
  assert.equal((await api.post(`${URL}/v1/locks/demo%2Forders/release`, { data: { lease_id: old.lease_id } })).status(), 200);
  const grant = await api.post(`${URL}/v1/locks/demo%2Forders/acquire`, { data: { ttl_ms: 30000, holder: "worker-7@host-b" } });
  assert.equal(grant.status(), 200);
  const { token } = await grant.json();
  assert.ok(token > old.token);
  // The row names the holder by its label; the feed says whom it was granted to.
  await page.locator('tr[data-lock="demo/orders"]').filter({ hasText: `#${token}` }).waitFor();
  assert.equal(await page.locator('tr[data-lock="demo/orders"] td.holder').textContent(), "worker-7@host-b");
  await page.locator("#feed li.granted").filter({ hasText: "to worker-7@host-b" }).waitFor();
  // The new holder writes; the old one's late write is refused, and the page says so.
  const w = await api.put(`${URL}/v1/store/demo-key`, { headers: { "Fencing-Token": String(token) }, data: "new" });
  assert.equal(w.status(), 200);
  const stale = await api.put(`${URL}/v1/store/demo-key`, { headers: { "Fencing-Token": String(old.token) }, data: "old" });
  assert.equal(stale.status(), 409);
  await page.locator('tr[data-key="demo-key"]').filter({ hasText: `#${token}` }).waitFor();
  await page.locator("#feed li.store_rejected").first().waitFor();
  await page.locator("#feed li.granted").first().waitFor();
  // The cluster card: a single server is a cluster of one, its own leader, and the
  // commit index it shows is the server's own.
  await page.locator('#members tr[data-member="1"].leader').waitFor();
  const cluster = await (await api.get(`${URL}/v1/cluster`)).json();
  assert.equal(cluster.leader_id, 1);
  await page.locator("#cluster-summary").filter({ hasText: "a cluster of one" }).waitFor();
  assert.match(await page.locator("#cluster-summary").textContent(), /leader #1 \(a cluster of one\), term \d+, commit index \d+/);
  await page.screenshot({ path: `${SHOTS}/live.png`, fullPage: true });
  await page.context().close();
});

test("no console errors on any page", () => {
  assert.deepEqual(errors, []);
});
