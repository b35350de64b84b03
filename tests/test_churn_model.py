#!/usr/bin/env python3
"""experiments/churn_model.py (issue 30): the goodput timeline against answers worked out by hand, the cost
measurement on a synthetic churn.py record, and the scenario's checkpoint policy."""
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))

import churn_model as cm  # noqa: E402

COSTS = {"U0": 2.0, "U_back": 3.0, "U_join": 4.0, "tail": 1.0, "stall_kill": 5.0, "stall_term": 0.5,
         "stall_join": 0.25, "R": 10.0, "period": 1.0}
P = {"nodes": 2, "steps": 100, "step_time": 1.0, "checkpoint_every": 0, "checkpoint_s": 0.0, "sync_every": 10}


def ev(kind, t, node, delay=7.0):
    return {"i": 0, "t_s": t, "kind": kind, "node": node, "delay_s": delay}


class Timeline(unittest.TestCase):
    def test_no_event_counts_start_up_and_tail(self):
        for cfg in ("ps_asp", "ring_elastic", "ps_bsp", "ring_restart"):
            r = cm.simulate(cfg, [], P, COSTS)
            # 2 nodes x 100 steps of 1 s, each present 2 + 100 + 1 s
            self.assertAlmostEqual(r["goodput"], 200 / (2 * 103), places=9, msg=cfg)
            self.assertAlmostEqual(r["time_to_end_s"], 103, places=9)

    def test_checkpoints_hold_every_node(self):
        p = dict(P, checkpoint_every=25, checkpoint_s=2.0)
        r = cm.simulate("ps_asp", [], p, COSTS)
        self.assertAlmostEqual(r["time_to_end_s"], 103 + 3 * 2.0, places=9)  # at steps 25, 50, 75

    def test_asp_crash_costs_the_node_its_step_and_node_0_waits_for_it(self):
        # t_s counts from the first step's end (U0 + T = 3): the kill is at 23.5, in node 1's 22nd step (21
        # done). It is back at 30.5, ready at 33.5, and goes on from its own clock (the servers' join_clock):
        # its 79 steps end at 112.5. Node 0 waits for it (the job's final evaluation); the others leave.
        r = cm.simulate("ps_asp", [ev("kill9", 20.5, 1)], P, COSTS)
        self.assertAlmostEqual(r["time_to_end_s"], 113.5, places=9)
        self.assertEqual(r["lost_node_steps"]["in_flight"], 1)
        self.assertEqual(r["useful_node_steps"], 200)
        self.assertAlmostEqual(r["present_node_s"], 113.5 + 23.5 + (113.5 - 30.5), places=9)
        three = cm.simulate("ps_asp", [ev("kill9", 20.5, 1)], dict(P, nodes=3), COSTS)
        self.assertAlmostEqual(three["present_node_s"], 113.5 + 23.5 + (113.5 - 30.5) + 103, places=9)

    def test_an_asp_joiner_starts_at_the_slowest_live_clock_and_late_events_do_not_happen(self):
        r = cm.simulate("ps_asp", [ev("join", 47.0, 2), ev("kill9", 500.0, 0)], P, COSTS)
        # Launched at 50, ready at 54, when every node has done 52 steps: it takes steps 53-100 by 102.
        self.assertEqual(r["useful_node_steps"], 200 + 48)
        self.assertAlmostEqual(r["time_to_end_s"], 103, places=9)
        self.assertEqual(r["lost_node_steps"]["in_flight"], 0)

    def test_an_asp_node_back_after_the_servers_timeout_starts_at_the_slowest_live_clock(self):
        # As above, but the servers counted node 1 out 5 s after its death: ready at 33.5, it joins at the
        # others' clock (31 steps done) and takes steps 32-100 by 102.5; its steps 22-31 are never taken.
        r = cm.simulate("ps_asp", [ev("kill9", 20.5, 1)], dict(P, worker_timeout_s=5.0), COSTS)
        self.assertEqual(r["useful_node_steps"], 100 + 21 + 69)
        self.assertAlmostEqual(r["time_to_end_s"], 103.5, places=9)

    def test_bsp_waits_for_the_timeout_or_the_return_and_backup_workers_do_not(self):
        p = dict(P, worker_timeout_s=5.0)
        bsp = cm.simulate("ps_bsp", [ev("kill9", 20.5, 1, delay=500)], p, COSTS)
        self.assertAlmostEqual(bsp["time_to_end_s"], 103 + 5 - 0.5, places=9)  # the timeout runs from the death
        back = cm.simulate("ps_bsp", [ev("kill9", 20.5, 1, delay=0.5)], p, COSTS)  # back and joined at 27
        self.assertAlmostEqual(back["time_to_end_s"], 103 + 0.5 + 3 - 0.5, places=9)
        backup = cm.simulate("ps_bsp_backup", [ev("kill9", 20.5, 1, delay=500)], dict(p, nodes=3), COSTS)
        self.assertAlmostEqual(backup["time_to_end_s"], 103, places=9)
        # Until the timeout (23.5 + 5) the dead node is the round's missing push: the 6 rounds that start before
        # it (at 23, 24, ..., 28) drop no late gradient; every other round drops one.
        self.assertAlmostEqual(backup["lost_node_steps"]["backup_dropped"], 100 - 6, places=9)
        # Two dead members inside the timeout with one backup worker: the rounds wait until the first is counted
        # out (23.5 + 5), as plain BSP does.
        two = cm.simulate("ps_bsp_backup", [ev("kill9", 20.5, 1, delay=500), ev("kill9", 20.7, 2, delay=500)],
                          dict(p, nodes=4), COSTS)
        self.assertAlmostEqual(two["time_to_end_s"], 103 + 5 - 0.5, places=9)

    def test_the_restarting_ring_waits_and_recomputes_since_its_checkpoint(self):
        p = dict(P, checkpoint_every=10, checkpoint_s=0.0)
        r = cm.simulate("ring_restart", [ev("kill9", 20.5, 1, delay=7.0)], p, COSTS)
        # Killed at 23.5 in step 22 (21 done, last checkpoint at 20): back at 30.5, resumes at 40.5 from step 20.
        self.assertEqual(r["lost_node_steps"]["recomputed"], 2 * 1)
        self.assertAlmostEqual(r["time_to_end_s"], 40.5 + 80 + 1, places=9)
        self.assertAlmostEqual(r["useful_node_steps"], 200, places=9)  # every step once, some twice
        self.assertAlmostEqual(r["present_node_s"], 121.5 + 23.5 + (121.5 - 30.5), places=9)

    def test_a_second_failure_during_a_restart_delays_it_and_falls_back_no_further(self):
        p = dict(P, nodes=3, checkpoint_every=10)
        one = cm.simulate("ring_restart", [ev("kill9", 30.5, 1, delay=20.0)], p, COSTS)
        two = cm.simulate("ring_restart", [ev("kill9", 30.5, 1, delay=20.0), ev("kill9", 32.5, 2, delay=1.0)], p, COSTS)
        self.assertEqual(two["lost_node_steps"]["recomputed"], one["lost_node_steps"]["recomputed"])
        self.assertGreaterEqual(two["time_to_end_s"], one["time_to_end_s"])
        self.assertEqual(one["useful_node_steps"], 300)

    def test_the_restarting_ring_cannot_take_a_join(self):
        self.assertEqual(cm.simulate("ring_restart", [ev("join", 10, 2)], P, COSTS)["goodput"],
                         cm.simulate("ring_restart", [], P, COSTS)["goodput"])

    def test_the_elastic_ring_abandons_the_step_and_admits_at_a_boundary(self):
        r = cm.simulate("ring_elastic", [ev("kill9", 20.5, 1, delay=7.0)], P, COSTS)
        # The step in flight is redone (1 s) after the re-formation (stall_kill); the node is admitted later with
        # a pause for the state broadcast.
        self.assertAlmostEqual(r["time_to_end_s"], 103 + 1 + COSTS["stall_kill"] + COSTS["stall_join"], places=9)
        self.assertGreater(r["lost_node_steps"]["in_flight"], 0)

    def test_local_sgd_drops_the_lost_nodes_partial_round(self):
        r = cm.simulate("ps_async_local_sgd", [ev("kill9", 24.5, 1, delay=10)], P, COSTS)
        # Killed at 27.5, in its 26th step: steps 21-25 of the round 21-30 were never pushed; it redoes them.
        self.assertEqual(r["lost_node_steps"]["partial_rounds"], 5)
        self.assertEqual(r["useful_node_steps"], 200)
        # Back at 37.5, ready at 40.5, 80 steps: done at 120.5; node 0 waits.
        self.assertAlmostEqual(r["time_to_end_s"], 121.5, places=9)
        d = cm.simulate("ps_diloco_elastic", [ev("kill9", 24.5, 1, delay=10)], dict(P, worker_timeout_s=5.0), COSTS)
        self.assertEqual(d["lost_node_steps"]["partial_rounds"], 5)
        # DiLoCo on BSP servers: node 0 goes on with its inner steps and waits at the round's sum (step 30, at
        # 32) only for what is left of the timeout (killed at 27.5: until 32.5).
        self.assertAlmostEqual(d["time_to_end_s"], 103 + 0.5, places=9)

    def test_a_kill_during_a_checkpoint_write_falls_back_to_the_previous_checkpoint(self):
        p = dict(P, checkpoint_every=10, checkpoint_s=5.0)
        # The write at step 20 holds [27, 32) (2 + 20 steps + 1 earlier write of 5 s).
        during = cm.simulate("ring_restart", [ev("kill9", 25.5, 1, delay=1.0)], p, COSTS)
        after = cm.simulate("ring_restart", [ev("kill9", 30.5, 1, delay=1.0)], p, COSTS)
        self.assertEqual(during["lost_node_steps"]["recomputed"], 2 * 10)  # 20 -> 10
        self.assertEqual(after["lost_node_steps"]["recomputed"], 2 * 1)    # step 20's write was complete

    def test_a_shard_that_dies_with_its_node_holds_every_push_until_it_is_back(self):
        costs = dict(COSTS, shard_up=2.0)
        # ASP, 3 nodes: node 1 is killed at 23.5 in its 22nd step, back at 30.5, its shard serving at 32.5.
        # Where node 1 hosts a shard, the 22nd pushes of nodes 0 and 2 (due at 24) wait until 32.5: their 78
        # more steps end at 110.5, not 102. Node 1 is the laggard either way (112.5), and node 0 waits for it.
        p = dict(P, nodes=3)
        free = cm.simulate("ps_asp", [ev("kill9", 20.5, 1)], dict(p, shard_hosts=[0]), costs)  # node 0's shard
        down = cm.simulate("ps_asp", [ev("kill9", 20.5, 1)], dict(p, shard_hosts=[1]), costs)
        self.assertAlmostEqual(free["time_to_end_s"], 113.5, places=9)
        self.assertAlmostEqual(down["time_to_end_s"], 113.5, places=9)
        self.assertAlmostEqual(down["present_node_s"], free["present_node_s"] + 8.5, places=9)  # node 2
        self.assertEqual(down["useful_node_steps"], 300)
        # Asynchronous local SGD: only a round's last step pushes. Killed at 27.5 (back 37.5, shard at 39.5):
        # node 2's push at step 30 (due at 32) waits until 39.5, and its 70 more steps end at 109.5, not 102.
        f = cm.simulate("ps_async_local_sgd", [ev("kill9", 24.5, 1, delay=10)], dict(p, shard_hosts=[0]), costs)
        d = cm.simulate("ps_async_local_sgd", [ev("kill9", 24.5, 1, delay=10)], dict(p, shard_hosts=[1]), costs)
        self.assertAlmostEqual(d["present_node_s"], f["present_node_s"] + 7.5, places=9)
        # BSP (timeout 5 s): the rounds wait for the shard (32.5), past the dead member's timeout (28.5).
        q = dict(P, worker_timeout_s=5.0)
        bsp = cm.simulate("ps_bsp", [ev("kill9", 20.5, 1)], dict(q, shard_hosts=[1]), costs)
        self.assertAlmostEqual(bsp["time_to_end_s"], 32.5 + 78 + 1, places=9)
        self.assertAlmostEqual(cm.simulate("ps_bsp", [ev("kill9", 20.5, 1)], q, costs)["time_to_end_s"], 107.5, places=9)
        # A SIGTERM: the node leaves after its step (24) and takes its shard; back at 31, the shard at 33.
        term = cm.simulate("ps_bsp", [ev("sigterm", 20.5, 1)], dict(q, shard_hosts=[1]), costs)
        self.assertAlmostEqual(term["time_to_end_s"], 33 + 78 + 1, places=9)
        self.assertAlmostEqual(cm.simulate("ps_bsp", [ev("sigterm", 20.5, 1)], q, costs)["time_to_end_s"], 103, places=9)
        self.assertEqual(term["shard_outages_s"], [33 - 23.5])
        # ... but not when that step was the job's last (in [101, 102)): the job is done.
        last = cm.simulate("ps_bsp", [ev("sigterm", 98.5, 1)], dict(q, shard_hosts=[1]), costs)
        self.assertAlmostEqual(last["time_to_end_s"], 103, places=9)
        # ASP: the SIGTERM (23.7) takes the shard down with the worker (launch_node.sh TERMs both); node 1 ends its
        # step at 24 and leaves, back at 31, its shard at 33. Node 2's push due at 24 waits until 33; node 1 comes
        # back at 34 at the others' clock (23 steps; it FINISHed); all end at 111, node 0's final evaluation at 112.
        asp = cm.simulate("ps_asp", [ev("sigterm", 20.7, 1)], dict(p, shard_hosts=[1]), costs)
        self.assertAlmostEqual(asp["time_to_end_s"], 112, places=9)
        self.assertAlmostEqual(asp["shard_outages_s"][0], 33 - 23.7, places=9)
        # The rings have no shards: the argument changes nothing.
        self.assertEqual(cm.simulate("ring_elastic", [ev("kill9", 20.5, 1)], dict(P, shard_hosts=[1]), costs),
                         cm.simulate("ring_elastic", [ev("kill9", 20.5, 1)], P, costs))

    def test_a_killed_shard_rolls_back_to_its_checkpoint_and_a_sigtermed_one_does_not(self):
        # ASP, 3 nodes, shards on nodes 1 and 2, a checkpoint every 10 updates. The kill at 23.5 finds 21 steps
        # of each node pushed (ending 3..23): 63 updates of each shard, 3 since its checkpoint at 60. Node 1's
        # shard reloads it: the work of those 3 pushes on its half of the parameters, 1.5 node-steps, is lost.
        p = dict(P, nodes=3, shard_hosts=[1, 2])
        kill = [ev("kill9", 20.5, 1)]
        none = cm.simulate("ps_asp", kill, p, COSTS)
        r = cm.simulate("ps_asp", kill, dict(p, shard_checkpoint_every=10), COSTS)
        self.assertEqual(none["lost_node_steps"]["shard_rollback"], 0.0)
        self.assertAlmostEqual(r["lost_node_steps"]["shard_rollback"], 1.5, places=9)
        self.assertAlmostEqual(r["useful_node_steps"], none["useful_node_steps"] - 1.5, places=9)
        self.assertEqual(r["time_to_end_s"], none["time_to_end_s"])  # the rollback costs work, not time here
        # A shard on a node no event touches loses nothing.
        other = cm.simulate("ps_asp", kill, dict(p, shard_hosts=[0, 2], shard_checkpoint_every=10), COSTS)
        self.assertEqual(other["lost_node_steps"]["shard_rollback"], 0.0)
        # Every membership change forces every shard's checkpoint (an elastic job's servers), every 1000 here.
        # Kill only: all 63 updates since the admissions at 2 are lost on half the parameters, 31.5.
        q = dict(p, shard_checkpoint_every=1000)
        self.assertAlmostEqual(cm.simulate("ps_asp", kill, q, COSTS)["lost_node_steps"]["shard_rollback"], 31.5, places=9)
        # Node 0 (no shard) SIGTERMed at 13.5 FINISHes: the shards write; nodes 1 and 2 then push steps 14..23
        # (node 0 is back at 24): 20 updates, 10 node-steps lost.
        term = cm.simulate("ps_asp", [ev("sigterm", 10.5, 0)] + kill, q, COSTS)
        self.assertAlmostEqual(term["lost_node_steps"]["shard_rollback"], 10.0, places=9)
        # Node 2 (a host) SIGTERMed: its shard is away 13.5..21 and the pushes due there wait; after the write, the
        # held pushes at 21 and steps 22 and 23 of nodes 0 and 1: 6 updates, 3 node-steps.
        term2 = cm.simulate("ps_asp", [ev("sigterm", 10.5, 2)] + kill, q, COSTS)
        self.assertAlmostEqual(term2["lost_node_steps"]["shard_rollback"], 3.0, places=9)
        # A joiner (ready at 17.5) forces the write too: steps 18..23 of nodes 0-2 and 18.5..23.5 of node 3 before
        # the kill at 23.7: 24 updates, 12 node-steps.
        join = cm.simulate("ps_asp", [ev("join", 10.5, 3), ev("kill9", 20.7, 1)], q, COSTS)
        self.assertAlmostEqual(join["lost_node_steps"]["shard_rollback"], 12.0, places=9)
        # Shard 0 holds the data grants and writes when its reserve of 257 grants runs out: at 302 updates it
        # has 45 since, where shard 1 has all 302 (ASP, 2 nodes, both hosts, killed at 153.5).
        d = dict(P, steps=300, shard_hosts=[0, 1], shard_checkpoint_every=1000)
        self.assertAlmostEqual(cm.simulate("ps_asp", [ev("kill9", 150.5, 0)], d, COSTS)["lost_node_steps"]["shard_rollback"],
                               45 / 2, places=9)
        self.assertAlmostEqual(cm.simulate("ps_asp", [ev("kill9", 150.5, 1)], d, COSTS)["lost_node_steps"]["shard_rollback"],
                               302 / 2, places=9)
        # DiLoCo on servers (rounds, every 1000): 2 rounds of 3 members x 10 steps before the kill at 27.5, 30.
        dl = cm.simulate("ps_diloco_elastic", [ev("kill9", 24.5, 1)], dict(q, worker_timeout_s=5.0), COSTS)
        self.assertAlmostEqual(dl["lost_node_steps"]["shard_rollback"], 30.0, places=9)
        # Asynchronous local SGD (H = 10), every 4 updates: killed at 27.5, each node has pushed rounds 10 and 20
        # (6 updates, 2 since the checkpoint at 4): 2 rounds x 10 node-steps on half the parameters = 10.
        a = cm.simulate("ps_async_local_sgd", [ev("kill9", 24.5, 1)], dict(p, shard_checkpoint_every=4), COSTS)
        self.assertAlmostEqual(a["lost_node_steps"]["shard_rollback"], 10.0, places=9)
        self.assertEqual(a["lost_node_steps"]["partial_rounds"], 5)
        # BSP, 2 nodes, one shard on node 1, every 10 rounds: the kill (23.5) falls in round 22; 21 rounds were
        # applied, the last (round 21, both members: 2 node-steps) after the checkpoint at 20.
        q = dict(P, worker_timeout_s=5.0, shard_hosts=[1])
        b0 = cm.simulate("ps_bsp", kill, q, COSTS)
        b = cm.simulate("ps_bsp", kill, dict(q, shard_checkpoint_every=10), COSTS)
        self.assertAlmostEqual(b["lost_node_steps"]["shard_rollback"], 2.0, places=9)
        self.assertAlmostEqual(b["useful_node_steps"], b0["useful_node_steps"] - 2.0, places=9)

    def test_server_machines_count_as_present(self):
        base = cm.simulate("ps_asp", [], P, COSTS)
        two = cm.simulate("ps_asp", [], dict(P, server_machines=2), COSTS)
        self.assertAlmostEqual(two["present_node_s"], base["present_node_s"] + 2 * 103, places=9)
        self.assertLess(two["goodput"], base["goodput"])


class Measure(unittest.TestCase):
    def test_costs_come_from_the_record_and_the_metrics(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "node0"))
            t0 = 1000.0
            with open(os.path.join(d, "node0", "metrics.jsonl"), "w") as f:
                for s in range(1, 11):
                    f.write(json.dumps({"step": s, "loss": 1.0, "unix_s": t0 + 0.5 + 0.1 * s}) + "\n")
            rec = {"config": "ps_asp", "dir": d, "events": [], "metrics": {},
                   "incarnations": [{"node": 0, "inc": 0, "start_unix": t0, "end_unix": t0 + 1.5 + 0.2,
                                     "ended_by": "exit"}]}
            st = {"step_time": 0.1, "nodes": 1, "checkpoint_every": 0, "steps": 10}
            obs = cm.measure_run(rec, st)
            self.assertAlmostEqual(obs["U0"][0], 0.5, places=6)   # first step at 0.6, minus its 0.1
            self.assertAlmostEqual(obs["tail"][0], 0.2, places=6)
            self.assertEqual(len(obs["period"]), 9)
            self.assertAlmostEqual(sum(obs["period"]) / 9, 0.1, places=6)


class Scenario(unittest.TestCase):
    def test_young_daly_for_the_restarting_ring_and_a_disaster_interval_for_the_rest(self):
        a = type("A", (), {"events_per_min": 0.1, "checkpoint_s": 30.0, "step_s": 1.0, "disaster_min": 30.0})()
        self.assertEqual(cm.checkpoint_every(a, "ring_restart", "own"), round(math.sqrt(2 * 30 * 900)))
        self.assertEqual(cm.checkpoint_every(a, "ps_asp", "own"), 1800)
        self.assertEqual(cm.checkpoint_every(a, "ps_asp", "same"), round(math.sqrt(2 * 30 * 900)))


if __name__ == "__main__":
    unittest.main()
