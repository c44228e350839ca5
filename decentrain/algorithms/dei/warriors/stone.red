;redcode-94
;name Split Stone
;author decentrain
;strategy two processes bombing with a 3-step pattern, then a spl/jmp loop
step    equ     3044
start   spl     bomber
        jmp     start+1
bomber  mov.i   bomb, @ptr
        add.ab  #step, ptr
        djn.b   bomber, #1600
ptr     dat     #0, #step
bomb    dat     #1, #1
        end     start
