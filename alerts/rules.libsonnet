// Recording rules computed straight from the serving engines' counters, for users who want
// the SD signals in Prometheus without running the exporter (and as a cross-check of it).
//
// Naming follows `level:metric:operations`: the level names the labels kept
// (`model_name`; `job` and the cluster label are always kept as well), the metric drops
// vLLM's `vllm:` prefix (recorded names may contain colons only as separators) and the
// operations end with the rate window, e.g.
// model_name:vllm_spec_decode_acceptance_rate:ratio_rate5m.
//
// vLLM's names are the canonical ones for a mixed fleet: each other engine (SGLang,
// TensorRT-LLM, llama.cpp; selectors in config.libsonnet) has a group that records its
// counters into the same names, so alerts and dashboards read every engine alike. The ratio
// rules of the vLLM group read the recorded rates, whichever group recorded them; an engine
// group records only what the ratios cannot give for it. What an engine does not count is
// not recorded for it (docs/metrics.md, "Signals per engine").
//
// Ratios are formed from summed numerators and denominators (never averaged), and every
// denominator is guarded with `> 0`: with no drafts in the window the ratio is absent, not
// 0 and not NaN, so an idle server never looks like a server with bad acceptance.
{
  local c = $._config,
  local w = c.rateWindow,
  local by = '%s, job, model_name' % c.clusterLabel,
  local level = 'model_name',
  local name(metric, ops) = '%s:%s:%s' % [level, metric, ops],

  // Names of the recorded series, for the alerts and dashboards that read them.
  _recordedNames:: {
    draftTokens: name('vllm_spec_decode_num_draft_tokens', 'rate' + w),
    acceptedTokens: name('vllm_spec_decode_num_accepted_tokens', 'rate' + w),
    drafts: name('vllm_spec_decode_num_drafts', 'rate' + w),
    acceptanceRate: name('vllm_spec_decode_acceptance_rate', 'ratio_rate' + w),
    acceptanceAlpha: name('vllm_spec_decode_acceptance_alpha', 'ratio_rate' + w),
    acceptanceLength: name('vllm_spec_decode_acceptance_length', 'ratio_rate' + w),
    draftLength: name('vllm_spec_decode_draft_length', 'ratio_rate' + w),
    draftLengthConfigured: name('vllm_spec_decode_draft_length_configured', 'max'),
    positionAcceptanceRate:
      'model_name_position:vllm_spec_decode_position_acceptance_rate:ratio_rate' + w,
    arrivalRate: name('vllm_request_success', 'rate' + w),
  },
  local n = self._recordedNames,

  local sumRate(metric, sel=c.vllmSelector) =
    'sum by (%(by)s) (rate(%(metric)s{%(sel)s}[%(w)s]))' % {
      by: by,
      metric: metric,
      sel: sel,
      w: w,
    },
  // An engine's group: its rules record into the canonical names with the label
  // serving_engine, which keeps them apart from the vLLM group's rules of the same name.
  local engineGroup(engine, rules) = {
    name: 'specwatch-%s-spec-decode.rules' % engine,
    rules: [r { labels+: { serving_engine: engine } } for r in rules],
  },
  // `expr` with model_name `model` where it has none (an engine that labels no model).
  local named(expr, model) =
    if model == '' then expr
    else 'label_replace(%s, "model_name", "%s", "model_name", "")' % [expr, model],
  // The share of verification steps whose draft token at each position was accepted, from an
  // engine's per-position accepted counter (`counter{sel}`, position in label `posLabel`).
  local positionRate(counter, sel, posLabel, model='') =
    |||
      %(num)s
      / on (%(by)s) group_left ()
      (%(drafts)s > 0)
    ||| % {
      by: by,
      drafts: n.drafts,
      num: named(|||
        sum by (%(by)s, position) (
          label_replace(rate(%(counter)s{%(sel)s}[%(w)s]), "position", "$1", "%(pos)s", "(.*)")
        )
      ||| % { by: by, counter: counter, sel: sel, w: w, pos: posLabel }, model),
    },
  // The α: position 0's share of the verification steps.
  local firstPosition(counter, sel, posLabel, model='') =
    |||
      %(num)s
      / on (%(by)s)
      (%(drafts)s > 0)
    ||| % {
      by: by,
      drafts: n.drafts,
      num: named(|||
        sum by (%(by)s) (
          rate(%(counter)s{%(sel)s, %(pos)s="0"}[%(w)s])
        )
      ||| % { by: by, counter: counter, sel: sel, w: w, pos: posLabel }, model),
    },

  prometheusRules+:: {
    groups+: [
      {
        name: 'specwatch-vllm-spec-decode.rules',
        rules: [
          {
            // Draft tokens proposed and verified per second.
            record: n.draftTokens,
            expr: sumRate('vllm:spec_decode_num_draft_tokens_total'),
          },
          {
            // Draft tokens accepted per second (the bonus token is not included).
            record: n.acceptedTokens,
            expr: sumRate('vllm:spec_decode_num_accepted_tokens_total'),
          },
          {
            // Verification steps (request x engine step with at least one draft) per second.
            record: n.drafts,
            expr: sumRate('vllm:spec_decode_num_drafts_total'),
          },
          {
            // vLLM's acceptance rate: accepted / proposed draft tokens, 0-1.
            record: n.acceptanceRate,
            expr: '%s\n/\n(%s > 0)\n' % [n.acceptedTokens, n.draftTokens],
          },
          {
            // The draft-length-independent acceptance α (the exporter's sd_acceptance_alpha,
            // method first_position): the share of verification steps whose first draft
            // token was accepted. Unlike the rate above it does not fall with k; at k = 1 it
            // equals it. Absent on servers without per-position counters (vLLM V0).
            record: n.acceptanceAlpha,
            expr: |||
              sum by (%(by)s) (
                rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{%(sel)s, position="0"}[%(w)s])
              )
              /
              (%(drafts)s > 0)
            ||| % { by: by, sel: c.vllmSelector, w: w, drafts: n.drafts },
            labels: { method: 'first_position' },
          },
          {
            // Mean tokens committed per verification step, bonus token included: 1..k+1.
            record: n.acceptanceLength,
            expr: '1 + %s\n/\n(%s > 0)\n' % [n.acceptedTokens, n.drafts],
          },
          {
            // Effective draft length: draft tokens per verification step (<= configured k).
            record: n.draftLength,
            expr: '%s\n/\n(%s > 0)\n' % [n.draftTokens, n.drafts],
          },
          {
            // Configured k: vLLM creates one per-position series per draft position at
            // startup, whether or not traffic has reached it.
            record: n.draftLengthConfigured,
            expr: |||
              max by (%(by)s) (
                count by (%(by)s, instance, engine) (
                  vllm:spec_decode_num_accepted_tokens_per_pos_total{%(sel)s}
                )
              )
            ||| % { by: by, sel: c.vllmSelector },
          },
          {
            // Share of verification steps whose draft token at `position` was accepted.
            record: n.positionAcceptanceRate,
            expr: |||
              sum by (%(by)s, position) (
                rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{%(sel)s}[%(w)s])
              )
              / on (%(by)s) group_left ()
              (%(drafts)s > 0)
            ||| % { by: by, sel: c.vllmSelector, w: w, drafts: n.drafts },
          },
          {
            // Finished requests per second, vLLM's closest signal to the arrival rate
            // (vLLM has no arrival counter; in steady state completions equal arrivals).
            record: n.arrivalRate,
            expr: sumRate('vllm:request_success_total'),
          },
        ],
      },
      // SGLang 0.5 counts no proposed or accepted token: its verify calls (forward passes
      // of finished requests) and generated tokens give the acceptance length, the
      // proposed tokens per verify call (spec_num_draft_tokens - 1) the rate.
      engineGroup('sglang', [
        {
          record: n.acceptanceLength,
          expr: |||
            (
              %(generated)s
              -
              %(finished)s
            )
            /
            (%(verify)s > 0)
          ||| % {
            generated: sumRate('sglang:generation_tokens_total', c.sglangSelector),
            finished: sumRate('sglang:num_requests_total', c.sglangSelector),
            verify: sumRate('sglang:spec_verify_calls_total', c.sglangSelector),
          },
        },
        {
          record: n.acceptanceRate,
          expr: |||
            (%(length)s - 1)
            / on (%(by)s)
            (max by (%(by)s) (sglang:spec_num_draft_tokens{%(sel)s}) - 1 > 0)
          ||| % { length: n.acceptanceLength, by: by, sel: c.sglangSelector },
        },
        {
          record: n.draftLengthConfigured,
          expr: 'max by (%s) (sglang:spec_num_steps{%s})' % [by, c.sglangSelector],
        },
        {
          record: n.arrivalRate,
          expr: sumRate('sglang:num_requests_total', c.sglangSelector),
        },
      ]),
      // TensorRT-LLM counts drafted and accepted tokens per position of each finished
      // request: their sums are the token rates, position 0's drafted count the drafts (the
      // exporter reads the same counters; the per-iteration ones also count running
      // requests). Its configured k is in a label (speculative_config_info), which PromQL
      // cannot read as a number: the positions drafted so far stand in for it.
      engineGroup('trtllm', [
        {
          record: n.draftTokens,
          expr: sumRate('trtllm_spec_decode_drafted_tokens_total', c.trtllmSelector),
        },
        {
          record: n.acceptedTokens,
          expr: sumRate('trtllm_spec_decode_accepted_tokens_total', c.trtllmSelector),
        },
        {
          record: n.drafts,
          expr: sumRate('trtllm_spec_decode_drafted_tokens_total', c.trtllmSelector + ', token_position="0"'),
        },
        {
          record: n.acceptanceAlpha,
          expr: firstPosition('trtllm_spec_decode_accepted_tokens_total', c.trtllmSelector, 'token_position'),
          labels: { method: 'first_position' },
        },
        {
          record: n.draftLengthConfigured,
          expr: |||
            max by (%(by)s) (
              count by (%(by)s, instance) (
                trtllm_spec_decode_drafted_tokens_total{%(sel)s}
              )
            )
          ||| % { by: by, sel: c.trtllmSelector },
        },
        {
          record: n.positionAcceptanceRate,
          expr: positionRate('trtllm_spec_decode_accepted_tokens_total', c.trtllmSelector, 'token_position'),
        },
        {
          record: n.arrivalRate,
          expr: sumRate('trtllm_request_success_total', c.trtllmSelector),
        },
      ]),
      // llama-server: the same spec-decode counters as vLLM v1, no model label (one model
      // per server: named llamacppModelName), no finished-requests counter (so no arrival
      // rate) and no configured draft length on /metrics.
      engineGroup('llamacpp', [
        {
          record: n.draftTokens,
          expr: named(sumRate('llamacpp:spec_decode_num_draft_tokens_total', c.llamacppSelector), c.llamacppModelName),
        },
        {
          record: n.acceptedTokens,
          expr: named(sumRate('llamacpp:spec_decode_num_accepted_tokens_total', c.llamacppSelector), c.llamacppModelName),
        },
        {
          record: n.drafts,
          expr: named(sumRate('llamacpp:spec_decode_num_drafts_total', c.llamacppSelector), c.llamacppModelName),
        },
        {
          record: n.acceptanceAlpha,
          expr: firstPosition('llamacpp:spec_decode_num_accepted_tokens_per_pos_total', c.llamacppSelector, 'position', c.llamacppModelName),
          labels: { method: 'first_position' },
        },
        {
          record: n.positionAcceptanceRate,
          expr: positionRate('llamacpp:spec_decode_num_accepted_tokens_per_pos_total', c.llamacppSelector, 'position', c.llamacppModelName),
        },
      ]),
    ],
  },
}
