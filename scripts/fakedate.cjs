// `Date` shifted to the pinned day (CC_FAKE_DATE): the client's own override variable is
// stripped from release builds. Preloaded with NODE_OPTIONS=--require by scripts/real-client.sh
// and `ctxsim profile capture` (src/client_profile/probes.rs).
const pinned = Date.parse(`${process.env.CC_FAKE_DATE}T09:00:00Z`);
if (!Number.isNaN(pinned)) {
  const Real = Date;
  const offset = pinned - Real.now();
  class Pinned extends Real {
    constructor(...args) { if (args.length === 0) { super(Real.now() + offset); } else { super(...args); } }
    static now() { return Real.now() + offset; }
  }
  globalThis.Date = Pinned;
}
