"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { SegmentCover, FROM_HISTORY } = require("../src/lib/segments.js");

test("each step of the current segment newly covers the steps since its last one, where anything is held", () => {
  const c = new SegmentCover();
  c.newSegment();
  for (let s = 1; s <= 40; s++) {
    assert.equal(c.extend(s), null); // a run's first segment: beyond everything held
    c.held(s);
  }
  c.newSegment(); // rolled back to the step-10 checkpoint
  assert.deepEqual(c.extend(11), [11, 11]);
  assert.deepEqual(c.extend(15), [12, 15]); // sparse log steps: the steps between are covered too
  assert.equal(c.extend(15), null); // repeated (a resubscribe overlap)
  assert.equal(c.extend(12), null); // going back within the segment (another writer's log)
  assert.deepEqual(c.extend(45), [16, 45]);
  c.held(45);
  assert.equal(c.extend(46), null);
  assert.deepEqual([c.first, c.last], [11, 46]);
});

test("tags: what a history brought is older than any live segment; the current segment's own is not", () => {
  const c = new SegmentCover();
  c.fromServer = true;
  assert.equal(c.tag(), FROM_HISTORY);
  c.newSegment();
  c.newSegment();
  c.continueFrom({ first_step: 11, last_step: 15 });
  c.fromServer = false;
  assert.deepEqual(c.extend(16), null); // nothing held beyond 15 yet
  const live = c.tag();
  assert.equal(c.older(live), false);
  assert.equal(c.older(FROM_HISTORY), true);
  assert.equal(c.older(undefined), true);
  c.newSegment();
  assert.equal(c.older(live), true);
  c.continueFrom({ first_step: null, last_step: null }); // a segment with no step yet: nothing known
  assert.equal(c.last, null);
});
